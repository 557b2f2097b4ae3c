"""OS virtual memory, small enough to do by hand: page tables, TLBs and page-replacement policies.

Owns linear and two-level page-table translation (valid and present bits), page-table sizing, a TLB
over an access trace and FIFO/LRU/OPT/CLOCK replacement. Seeded problems live in
``simulators.paging_problems``, the exercises on them in ``simulators.paging_exercises``, the command
line (``python -m simulators.paging``) in ``simulators.paging_cli``. Returns plain dataclasses; pure
Python (never imports torch or numpy).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

POLICIES = ("FIFO", "LRU", "OPT", "CLOCK")
# How a linear page-table entry is printed, as in OSTEP's paging-linear-translate.py: bit 31 is the
# VALID bit and the rest is the PFN. Only a table with swapped-out pages (-w) also uses bit 30, the
# PRESENT bit; OSTEP's linear simulator has no present bit.
VALID_BIT = 0x80000000
PRESENT_BIT = 0x40000000
# A linear-table entry of SWAPPED is valid (the page belongs to the process) but not present (its
# contents are on disk): an access is a page fault the OS services, not a segmentation fault.
SWAPPED = -1

# ---------------------------------------------------------------------------------------------
# sizes and address arithmetic


def parse_size(text: str | int, what: str = "size") -> int:
    """``"16k"`` -> 16384, ``"1m"`` -> 1048576, ``"4g"``, or a plain byte count (> 0).

    Anything else is a ValueError that starts with ``what`` (e.g. ``"page size (-P)"``), if given."""
    prefix = f"{what}: " if what else ""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        s = str(text).strip().lower()
        scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
        digits = s[:-1] if scale > 1 else s
        if not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"{prefix}expected a size such as 16, 4k, 64k or 1m (k, m, g: powers "
                             f"of 1024), got {text!r}")
        value = int(digits) * scale
    if value <= 0:
        raise ValueError(f"{prefix}must be more than 0 bytes, got {text!r}")
    return value


def format_size(n: int) -> str:
    """The inverse of ``parse_size`` for exact multiples: 16384 -> ``"16k"``."""
    for unit, scale in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _log2_exact(n: int, what: str) -> int:
    if n <= 0 or n & (n - 1):
        raise ValueError(f"{what} must be a power of two, got {n}")
    return n.bit_length() - 1


def split_address(vaddr: int, page_size: int) -> tuple[int, int]:
    """(virtual page number, offset): the high bits pick the page, the low log2(page_size) bits
    are the offset inside it and are never translated."""
    bits = _log2_exact(page_size, "page size")
    return vaddr >> bits, vaddr & (page_size - 1)


@dataclass(frozen=True)
class Translation:
    """One virtual address run through a page table.

    ``valid``: the page belongs to the address space; ``present``: it is in a physical frame.
    Not valid -> a segmentation fault (the program touched memory it never allocated); valid but
    not present -> a page fault (the OS loads the page from disk and retries the access).
    Either way the hardware produces no ``paddr``.
    """

    vaddr: int
    vpn: int
    offset: int
    valid: bool
    pfn: int | None
    paddr: int | None
    memory_refs: int  # page-table entries read from memory (without a TLB)
    present: bool = True

    @property
    def fault(self) -> bool:
        return not (self.valid and self.present)

    @property
    def fault_kind(self) -> str | None:
        """None, ``"segfault"`` (invalid page) or ``"page fault"`` (valid, not present)."""
        if not self.valid:
            return "segfault"
        return None if self.present else "page fault"


@dataclass(frozen=True)
class LinearPageTable:
    """One entry per virtual page: the physical frame number (valid and present), ``SWAPPED``
    (valid, present bit clear: the page is on disk) or None (invalid: never allocated)."""

    page_size: int
    entries: tuple[int | None, ...]
    pte_size: int = 4

    @property
    def address_space_size(self) -> int:
        return len(self.entries) * self.page_size

    @property
    def size_bytes(self) -> int:
        """Memory the table itself takes: every virtual page has an entry, used or not."""
        return len(self.entries) * self.pte_size

    def translate(self, vaddr: int) -> Translation:
        """physical address = pfn * page_size + offset for a present page; a fault otherwise."""
        if not 0 <= vaddr < self.address_space_size:
            raise ValueError(
                f"virtual address {vaddr:#x} is outside the {self.address_space_size}-byte space: "
                f"use an address below {self.address_space_size:#x}"
            )
        vpn, offset = split_address(vaddr, self.page_size)
        pfn = self.entries[vpn]
        if pfn is None:
            return Translation(vaddr, vpn, offset, False, None, None, 1, present=False)
        if pfn == SWAPPED:
            return Translation(vaddr, vpn, offset, True, None, None, 1, present=False)
        return Translation(vaddr, vpn, offset, True, pfn, pfn * self.page_size + offset, 1)


def encode_pte(entry: int | None, present_bit: bool = False) -> int:
    """A linear-table entry as the simulator prints it: 0 (invalid), ``VALID_BIT | PFN``, or, with
    ``present_bit`` (a table that has swapped-out pages), ``VALID_BIT | PRESENT_BIT | PFN`` for a
    present page and ``VALID_BIT`` alone for a swapped-out one."""
    if entry is None:
        return 0
    if entry == SWAPPED:
        if not present_bit:
            raise ValueError("a swapped-out page needs the present bit (present_bit=True)")
        return VALID_BIT
    return VALID_BIT | (PRESENT_BIT if present_bit else 0) | entry


def decode_pte(pte: int, present_bit: bool = False) -> int | None:
    """The inverse of ``encode_pte``: a PFN, ``SWAPPED`` or None (invalid)."""
    if not pte & VALID_BIT:
        return None
    if present_bit:
        return pte & ~(VALID_BIT | PRESENT_BIT) if pte & PRESENT_BIT else SWAPPED
    return pte & ~VALID_BIT


def translate_ptes(vaddr: int, page_table: Sequence[int], page_size: int) -> int | None:
    """The physical address of ``vaddr`` through a linear table of printed entries (``encode_pte``
    without the present bit: ``VALID_BIT | PFN`` or 0), or None when its page is not valid. What the
    homework asks a student to do by hand, and the reference of notebook 01's implement-it task."""
    table = LinearPageTable(page_size, tuple(decode_pte(p) for p in page_table))
    return table.translate(vaddr).paddr


def linear_table_bytes(address_space_size: int, page_size: int, pte_size: int = 4) -> int:
    """Size of a linear page table: (address space / page size) entries of ``pte_size`` bytes."""
    _log2_exact(page_size, "page size")
    return address_space_size // page_size * pte_size


# ---------------------------------------------------------------------------------------------
# multi-level tables


@dataclass(frozen=True)
class Walk(Translation):
    """A two-level translation: the page-directory index, then the index inside that table page."""

    pd_index: int = 0
    pt_index: int = 0


@dataclass(frozen=True)
class TwoLevelPageTable:
    """A page directory whose entries point to page-sized pieces of the linear table; pieces with
    no valid entry are not allocated at all, which is where the memory saving comes from."""

    page_size: int
    pte_size: int
    directory: tuple[tuple[int | None, ...] | None, ...]

    @property
    def entries_per_page(self) -> int:
        return self.page_size // self.pte_size

    @classmethod
    def from_linear(cls, table: LinearPageTable) -> TwoLevelPageTable:
        """The same mapping as ``table``, stored as a directory of page-sized table pieces."""
        per_page = table.page_size // table.pte_size
        entries = list(table.entries)
        pieces = []
        for start in range(0, len(entries), per_page):
            piece = tuple(entries[start : start + per_page])
            pieces.append(piece if any(e is not None for e in piece) else None)
        return cls(table.page_size, table.pte_size, tuple(pieces))

    @property
    def size_bytes(self) -> int:
        """One page for the directory plus one page per allocated piece."""
        dir_bytes = max(self.page_size, len(self.directory) * self.pte_size)
        return dir_bytes + sum(self.page_size for p in self.directory if p is not None)

    def translate(self, vaddr: int) -> Walk:
        """Walk the directory, then the piece; either level can be invalid (a segfault), and a
        valid entry can be ``SWAPPED`` (a page fault)."""
        vpn, offset = split_address(vaddr, self.page_size)
        per_page = self.entries_per_page
        pd_index, pt_index = divmod(vpn, per_page)
        if not 0 <= pd_index < len(self.directory):
            raise ValueError(f"virtual address {vaddr:#x} is outside the address space")
        piece = self.directory[pd_index]
        where = dict(pd_index=pd_index, pt_index=pt_index)
        if piece is None:
            return Walk(vaddr, vpn, offset, False, None, None, 1, present=False, **where)
        pfn = piece[pt_index] if pt_index < len(piece) else None
        if pfn is None:
            return Walk(vaddr, vpn, offset, False, None, None, 2, present=False, **where)
        if pfn == SWAPPED:
            return Walk(vaddr, vpn, offset, True, None, None, 2, present=False, **where)
        paddr = pfn * self.page_size + offset
        return Walk(vaddr, vpn, offset, True, pfn, paddr, 2, **where)


def multilevel_table_bytes(
    mapped_vpns: Sequence[int], va_bits: int, page_size: int, pte_size: int, levels: int
) -> int:
    """Bytes of page table needed to map ``mapped_vpns`` with a ``levels``-level radix table.

    Each level indexes log2(page_size / pte_size) bits of the VPN (the top level takes the rest);
    a table page exists only if some mapped VPN passes through it. ``levels=1`` is the linear table.
    """
    offset_bits = _log2_exact(page_size, "page size")
    index_bits = _log2_exact(page_size // pte_size, "entries per page")
    vpn_bits = va_bits - offset_bits
    if vpn_bits <= 0:
        raise ValueError("the address space must be larger than one page")
    if levels == 1:
        return (1 << vpn_bits) * pte_size
    top_bits = vpn_bits - index_bits * (levels - 1)
    if top_bits <= 0:
        raise ValueError(f"{levels} levels need more than {vpn_bits} VPN bits")
    total = max(page_size, (1 << top_bits) * pte_size)  # the top-level table always exists
    vpns = set(mapped_vpns)
    for level in range(1, levels):
        # a table page at this level is identified by the VPN bits above its own index bits
        shift = index_bits * (levels - level)
        total += len({v >> shift for v in vpns}) * page_size
    return total


# ---------------------------------------------------------------------------------------------
# TLB


@dataclass(frozen=True)
class TLBResult:
    """Hits and misses of a TLB over a VPN trace; ``outcomes[i]`` is True for a hit."""

    num_entries: int
    policy: str
    outcomes: tuple[bool, ...]

    @property
    def hits(self) -> int:
        return sum(self.outcomes)

    @property
    def misses(self) -> int:
        return len(self.outcomes) - self.hits

    @property
    def hit_rate(self) -> float:
        return self.hits / len(self.outcomes) if self.outcomes else 0.0


def simulate_tlb(vpns: Sequence[int], num_entries: int, policy: str = "LRU") -> TLBResult:
    """Run a TLB of ``num_entries`` translations (LRU or FIFO replacement) over a trace of VPNs."""
    if num_entries < 1:
        raise ValueError("a TLB needs at least one entry")
    result = simulate_policy(vpns, num_entries, policy)
    return TLBResult(num_entries, result.policy, result.hits)


def array_walk_vpns(base: int, element_size: int, count: int, page_size: int) -> list[int]:
    """VPNs touched when a loop reads ``count`` elements of an array that starts at ``base``."""
    return [split_address(base + i * element_size, page_size)[0] for i in range(count)]


# ---------------------------------------------------------------------------------------------
# page replacement


@dataclass(frozen=True)
class PolicyResult:
    """A replacement policy over a page trace: per access, hit or miss, what was evicted, and the
    resident pages afterwards (in the policy's own order: FIFO/LRU oldest first, CLOCK by frame)."""

    policy: str
    num_frames: int
    trace: tuple[int, ...]
    hits: tuple[bool, ...]
    evicted: tuple[int | None, ...]
    resident: tuple[tuple[int, ...], ...]

    @property
    def num_hits(self) -> int:
        return sum(self.hits)

    @property
    def num_misses(self) -> int:
        return len(self.hits) - self.num_hits

    @property
    def hit_rate(self) -> float:
        return self.num_hits / len(self.hits) if self.hits else 0.0


def simulate_policy(trace: Sequence[int], num_frames: int, policy: str) -> PolicyResult:
    """Demand paging with ``num_frames`` frames, starting empty. OPT evicts the page used farthest
    in the future (ties: the one resident longest), CLOCK gives pages with the use bit set a second
    chance."""
    policy = policy.upper()
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if num_frames < 1:
        raise ValueError("need at least one frame")
    trace = tuple(int(p) for p in trace)
    hits: list[bool] = []
    evicted: list[int | None] = []
    resident: list[tuple[int, ...]] = []
    if policy == "CLOCK":
        frames: list[int | None] = [None] * num_frames
        use = [False] * num_frames
        hand = 0
        for page in trace:
            victim = None
            if page in frames:
                use[frames.index(page)] = True
                hits.append(True)
            else:
                hits.append(False)
                if None in frames:
                    slot = frames.index(None)
                else:
                    while use[hand]:
                        use[hand] = False
                        hand = (hand + 1) % num_frames
                    slot, victim = hand, frames[hand]
                    hand = (hand + 1) % num_frames
                frames[slot], use[slot] = page, True
            evicted.append(victim)
            resident.append(tuple(p for p in frames if p is not None))
        return PolicyResult(policy, num_frames, trace, tuple(hits), tuple(evicted), tuple(resident))

    memory: list[int] = []  # FIFO: load order; LRU: recency order; OPT: load order
    for i, page in enumerate(trace):
        victim = None
        if page in memory:
            hits.append(True)
            if policy == "LRU":
                memory.remove(page)
                memory.append(page)
        else:
            hits.append(False)
            if len(memory) == num_frames:
                if policy == "OPT":
                    victim = max(memory, key=lambda p: _next_use(trace, i, p))
                else:
                    victim = memory[0]
                memory.remove(victim)
            memory.append(page)
        evicted.append(victim)
        resident.append(tuple(memory))
    return PolicyResult(policy, num_frames, trace, tuple(hits), tuple(evicted), tuple(resident))


def _next_use(trace: tuple[int, ...], now: int, page: int) -> int:
    for j in range(now + 1, len(trace)):
        if trace[j] == page:
            return j
    return len(trace)  # never used again: the best victim


def random_trace(seed: int, length: int, max_page: int) -> list[int]:
    """A seeded trace of ``length`` page numbers drawn uniformly from 0..max_page."""
    rng = random.Random(seed)
    return [rng.randint(0, max_page) for _ in range(length)]




def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``python -m simulators.paging --help``); see ``simulators.paging_cli``."""
    from simulators.paging_cli import main as cli_main  # late: the CLI module imports this one

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())

"""OS virtual memory, small enough to do by hand: page tables, TLBs and page-replacement policies.

Owns linear and two-level page-table translation, page-table sizing, a TLB over an access trace,
FIFO/LRU/OPT/CLOCK replacement, seeded OSTEP-style problems and the ``python -m simulators.paging``
command line. Returns plain dataclasses; pure Python (never imports torch or numpy-heavy machinery).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from simulators.exercises import Exercise, Verdict

POLICIES = ("FIFO", "LRU", "OPT", "CLOCK")
VALID_BIT = 0x80000000  # how a linear page-table entry is printed: valid bit, then the PFN

# ---------------------------------------------------------------------------------------------
# sizes and address arithmetic


def parse_size(text: str | int) -> int:
    """``"16k"`` -> 16384, ``"1m"`` -> 1048576, ``"4g"``, or a plain byte count."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if s and s[-1] in units:
        return int(s[:-1]) * units[s[-1]]
    return int(s)


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
    """One virtual address run through a page table. ``fault`` is True when the page is not valid
    (the hardware raises an exception instead of producing ``paddr``)."""

    vaddr: int
    vpn: int
    offset: int
    valid: bool
    pfn: int | None
    paddr: int | None
    memory_refs: int  # page-table entries read from memory (without a TLB)

    @property
    def fault(self) -> bool:
        return not self.valid


@dataclass(frozen=True)
class LinearPageTable:
    """One entry per virtual page: the physical frame number, or None for an invalid page."""

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
        """physical address = pfn * page_size + offset for a valid page; a fault otherwise."""
        if not 0 <= vaddr < self.address_space_size:
            raise ValueError(
                f"virtual address {vaddr:#x} is outside the {self.address_space_size}-byte space"
            )
        vpn, offset = split_address(vaddr, self.page_size)
        pfn = self.entries[vpn]
        if pfn is None:
            return Translation(vaddr, vpn, offset, False, None, None, 1)
        return Translation(vaddr, vpn, offset, True, pfn, pfn * self.page_size + offset, 1)


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
        """Walk the directory, then the piece; either level can be invalid (a fault)."""
        vpn, offset = split_address(vaddr, self.page_size)
        per_page = self.entries_per_page
        pd_index, pt_index = divmod(vpn, per_page)
        if not 0 <= pd_index < len(self.directory):
            raise ValueError(f"virtual address {vaddr:#x} is outside the address space")
        piece = self.directory[pd_index]
        if piece is None:
            return Walk(vaddr, vpn, offset, False, None, None, 1, pd_index, pt_index)
        pfn = piece[pt_index] if pt_index < len(piece) else None
        if pfn is None:
            return Walk(vaddr, vpn, offset, False, None, None, 2, pd_index, pt_index)
        paddr = pfn * self.page_size + offset
        return Walk(vaddr, vpn, offset, True, pfn, paddr, 2, pd_index, pt_index)


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


# ---------------------------------------------------------------------------------------------
# seeded problems (the command line prints these; notebooks and tests use them directly)


@dataclass(frozen=True)
class LinearProblem:
    """A random address space: its page table and a trace of virtual addresses to translate."""

    args: dict
    table: LinearPageTable
    addresses: tuple[int, ...]
    answers: tuple[Translation, ...] = field(repr=False)


def random_linear_problem(
    seed: int,
    address_space_size: int | str = "16k",
    phys_mem_size: int | str = "64k",
    page_size: int | str = "4k",
    num_addresses: int = 5,
    used_percent: float = 50,
) -> LinearProblem:
    """OSTEP-style problem: each virtual page is valid with probability ``used_percent``% and then
    maps to a distinct random physical frame; addresses are drawn uniformly from the space."""
    asize, psize, page = (parse_size(x) for x in (address_space_size, phys_mem_size, page_size))
    _log2_exact(page, "page size")
    _log2_exact(asize, "address space size")
    _log2_exact(psize, "physical memory size")
    if page > asize:
        raise ValueError("the page size must not exceed the address space size")
    if not 0 <= used_percent <= 100:
        raise ValueError("used percent must be within 0..100")
    num_vpages, num_frames = asize // page, psize // page
    rng = random.Random(seed)
    valid = [rng.random() * 100 < used_percent for _ in range(num_vpages)]
    if sum(valid) > num_frames:
        raise ValueError(
            f"{sum(valid)} valid pages do not fit in {num_frames} physical frames: "
            "use more physical memory (-p) or a smaller used percent (-u)"
        )
    frames = rng.sample(range(num_frames), sum(valid))
    it = iter(frames)
    entries = tuple(next(it) if v else None for v in valid)
    table = LinearPageTable(page, entries)
    addresses = tuple(rng.randrange(asize) for _ in range(num_addresses))
    args = {
        "seed": seed,
        "address space size": format_size(asize),
        "phys mem size": format_size(psize),
        "page size": format_size(page),
        "num addresses": num_addresses,
        "used percent": used_percent,
    }
    return LinearProblem(args, table, addresses, tuple(table.translate(a) for a in addresses))


def make_exercise(seed: int, page_size: int | str = "4k", address_space_size: int | str = "16k",
                  phys_mem_size: int | str = "64k") -> Exercise:
    """Translate one address by hand. Answer with the physical address (int) or ``"fault"``."""
    problem = random_linear_problem(seed, address_space_size, phys_mem_size, page_size, 1, 60)
    table, t = problem.table, problem.answers[0]
    lines = [f"Page size {problem.args['page size']} ({table.page_size} bytes). Page table:"]
    for vpn, pfn in enumerate(table.entries):
        lines.append(f"  VPN {vpn:3d}: " + ("invalid" if pfn is None else f"valid, PFN {pfn}"))
    lines.append(f"Translate virtual address {t.vaddr:#06x} (decimal {t.vaddr}).")
    lines.append('Answer with the physical address as an int, or "fault".')
    solution = "fault" if t.fault else t.paddr

    def diagnose(answer) -> Verdict:
        if isinstance(answer, str) and answer.strip().lower() == "fault":
            if t.fault:
                return Verdict(True, f"VPN {t.vpn} has no valid entry, so the access faults.")
            return Verdict(False, f"VPN {t.vpn} is valid in the table; translate it.")
        try:
            value = int(answer)
        except (TypeError, ValueError):
            return Verdict(False, 'answer with an int (a physical address) or "fault".')
        if t.fault:
            return Verdict(False, f"the address is on VPN {t.vpn}, whose entry is invalid.")
        if value == t.paddr:
            return Verdict(True, f"VPN {t.vpn} -> PFN {t.pfn}; the offset {t.offset:#x} is kept.")
        if value & (table.page_size - 1) != t.offset:
            return Verdict(False, f"the offset is copied unchanged: yours is "
                                  f"{value & (table.page_size - 1):#x}, the address's is "
                                  f"{t.offset:#x}.")
        return Verdict(False, f"the offset is right, but frame {value // table.page_size} is not "
                              f"the one the entry for VPN {t.vpn} holds.")

    return Exercise(seed, "\n".join(lines), solution, diagnose)


# ---------------------------------------------------------------------------------------------
# command line: python -m simulators.paging {translate,multilevel,policy,tlb} ...


def _header(args: dict) -> str:
    return "\n".join(f"ARG {k} {v}" for k, v in args.items()) + "\n"


def _format_translation(t: Translation, compute: bool) -> str:
    head = f"  VA {t.vaddr:#010x} (decimal: {t.vaddr:8d}) --> "
    if not compute:
        return head + "PA or fault?"
    if t.fault:
        return head + f"fault (VPN {t.vpn} is not valid)"
    return head + f"{t.paddr:#010x} (decimal: {t.paddr:8d}) [VPN {t.vpn} -> PFN {t.pfn}]"


def render_translate(problem: LinearProblem, compute: bool) -> str:
    """The text the ``translate`` subcommand prints."""
    out = [_header({**problem.args, "compute answers": compute})]
    out.append("Linear page table, one entry per virtual page. The high-order bit is the VALID")
    out.append("bit; if it is set, the rest of the entry is the physical frame number (PFN).\n")
    for vpn, pfn in enumerate(problem.table.entries):
        value = 0 if pfn is None else VALID_BIT | pfn
        out.append(f"  [{vpn:8d}]  {value:#010x}")
    out.append("\nVirtual address trace")
    out.extend(_format_translation(t, compute) for t in problem.answers)
    if not compute:
        out.append("\nFor each virtual address, give the physical address or say it faults.")
        out.append("Run again with -c to see the answers.")
    return "\n".join(out) + "\n"


def render_multilevel(problem: LinearProblem, pte_size: int, compute: bool) -> str:
    """The text the ``multilevel`` subcommand prints: the same mapping as a two-level table."""
    table = TwoLevelPageTable.from_linear(
        LinearPageTable(problem.table.page_size, problem.table.entries, pte_size)
    )
    out = [_header({**problem.args, "pte size": pte_size, "compute answers": compute})]
    out.append(f"Two-level page table: {table.entries_per_page} entries per table page; the")
    out.append("directory entry says which table pages exist ('-' = not allocated).\n")
    for pd, piece in enumerate(table.directory):
        if piece is None:
            out.append(f"  PDE[{pd:4d}] -")
            continue
        cells = " ".join("  . " if p is None else f"{p:4d}" for p in piece)
        out.append(f"  PDE[{pd:4d}] valid: PTEs {cells}")
    out.append("\nVirtual address trace")
    for t in problem.answers:
        w = table.translate(t.vaddr)
        head = f"  VA {w.vaddr:#010x} (decimal: {w.vaddr:8d}) --> "
        if not compute:
            out.append(head + "PDE index, PTE index, PA or fault?")
        elif w.fault:
            out.append(head + f"PDE {w.pd_index}, PTE {w.pt_index}: fault")
        else:
            out.append(head + f"PDE {w.pd_index}, PTE {w.pt_index}: {w.paddr:#010x}")
    if compute:
        linear = len(problem.table.entries) * pte_size
        out.append(f"\nTable memory: linear {linear} B, two-level {table.size_bytes} B")
    return "\n".join(out) + "\n"


def render_policy(trace: Sequence[int], frames: int, policy: str, args: dict,
                  compute: bool) -> str:
    """The text the ``policy`` subcommand prints."""
    result = simulate_policy(trace, frames, policy)
    out = [_header({**args, "compute answers": compute})]
    out.append(f"Access trace: {','.join(map(str, result.trace))}\n")
    for page, hit, victim, mem in zip(result.trace, result.hits, result.evicted, result.resident,
                                      strict=True):
        if compute:
            what = "Hit " if hit else "Miss"
            ev = "-" if victim is None else str(victim)
            out.append(f"  Access: {page:3d}  {what}  evict {ev:>3s}  resident {list(mem)}")
        else:
            out.append(f"  Access: {page:3d}  Hit/Miss?  State of memory?")
    if compute:
        out.append(f"\nFINALSTATS hits {result.num_hits} misses {result.num_misses} "
                   f"hitrate {100 * result.hit_rate:.2f}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulators.paging", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def space_args(p):
        p.add_argument("-s", "--seed", type=int, default=0)
        p.add_argument("-a", "--asize", default="16k", help="address space size (e.g. 16k)")
        p.add_argument("-p", "--physmem", default="64k", help="physical memory size (e.g. 64k)")
        p.add_argument("-P", "--pagesize", default="4k", help="page size (e.g. 4k)")
        p.add_argument("-n", "--numaddrs", type=int, default=5)
        p.add_argument("-u", "--used", type=float, default=50, help="percent of pages valid")
        p.add_argument("-c", "--compute", action="store_true", help="show the answers")

    space_args(sub.add_parser("translate", help="linear page table translation"))
    ml = sub.add_parser("multilevel", help="two-level page table walk")
    space_args(ml)
    ml.add_argument("-e", "--ptesize", type=int, default=4, help="bytes per page-table entry")
    for name, helptext in (("policy", "page replacement"), ("tlb", "TLB hits and misses")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("-s", "--seed", type=int, default=0)
        p.add_argument("-n", "--numaddrs", type=int, default=10)
        p.add_argument("-m", "--maxpage", type=int, default=10)
        p.add_argument("-A", "--addresses", default="",
                       help="comma-separated trace (overrides -n, -m)")
        p.add_argument("-C", "--cachesize", type=int, default=3, help="frames (or TLB entries)")
        p.add_argument("-p", "--policy", default="FIFO" if name == "policy" else "LRU",
                       help="FIFO, LRU, OPT or CLOCK")
        p.add_argument("-c", "--compute", action="store_true", help="show the answers")

    ns = parser.parse_args(argv)
    try:
        if ns.command in ("translate", "multilevel"):
            problem = random_linear_problem(ns.seed, ns.asize, ns.physmem, ns.pagesize,
                                            ns.numaddrs, ns.used)
            if ns.command == "translate":
                print(render_translate(problem, ns.compute), end="")
            else:
                print(render_multilevel(problem, ns.ptesize, ns.compute), end="")
        else:
            if ns.addresses:
                trace = [int(x) for x in ns.addresses.split(",")]
            else:
                trace = random_trace(ns.seed, ns.numaddrs, ns.maxpage)
            args = {"seed": ns.seed, "addresses": ns.addresses or "-1", "numaddrs": ns.numaddrs,
                    "maxpage": ns.maxpage, "policy": ns.policy.upper(),
                    "cachesize": ns.cachesize}
            print(render_policy(trace, ns.cachesize, ns.policy, args, ns.compute), end="")
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

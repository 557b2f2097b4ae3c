"""Seeded paging problems, in the style of the OSTEP homework.

Owns the random (but seeded) linear problem (the one OSTEP's paging-linear-translate.py draws), the
two-level problem with a physical memory dump and a page-directory base register, and the trace that
shows Belady's anomaly; the exercises built on them are in simulators/paging_exercises.py. The same
seed always gives the same problem, here and on the command line. Never prints a solution by itself.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from simulators.paging import (
    SWAPPED,
    LinearPageTable,
    Translation,
    _log2_exact,
    encode_pte,
    format_size,
    parse_size,
    simulate_policy,
)

# ---------------------------------------------------------------------------------------------
# linear problems


@dataclass(frozen=True)
class LinearProblem:
    """A random address space: its page table and a trace of virtual addresses to translate."""

    args: dict
    table: LinearPageTable
    addresses: tuple[int, ...]
    answers: tuple[Translation, ...] = field(repr=False)

    @property
    def present_bit(self) -> bool:
        """Whether the printed entries carry a present bit: only when swapped pages were asked for."""
        return self.args["swapped percent"] > 0

    def ptes(self) -> list[int]:
        """The page table as printed: one 32-bit entry per virtual page (see ``encode_pte``)."""
        return [encode_pte(e, self.present_bit) for e in self.table.entries]


# Bounds that keep a run short: OSTEP's script refuses sizes of 1 GB or more; one printed line per
# virtual page and per address keeps the rest to seconds.
MAX_SIZE = 1 << 30
MAX_VIRTUAL_PAGES = 1 << 16
MAX_ADDRESSES = 100_000


def random_linear_problem(
    seed: int,
    address_space_size: int | str = "16k",
    phys_mem_size: int | str = "64k",
    page_size: int | str = "4k",
    num_addresses: int = 5,
    used_percent: float = 50,
    swapped_percent: float = 0,
    addresses: Sequence[int] | None = None,
) -> LinearProblem:
    """The problem OSTEP's ``paging-linear-translate.py`` prints for the same seed and sizes.

    Page by page, from VPN 0: with probability ``used_percent``% the page is valid and gets a random
    free frame (a draw that lands on a taken frame starts the page over, as OSTEP's does), else it is
    invalid; then ``num_addresses`` addresses are drawn uniformly from the space, unless
    ``addresses`` (the command line's ``-A``) gives them. ``swapped_percent``% of the valid pages are
    then marked swapped out (valid, not present) from a second random stream, so ``-w`` changes
    neither the frames nor the addresses. Sizes follow OSTEP's rules: the address space and the page
    size are powers of two, physical memory is any multiple of the page size larger than the address
    space, and both stay below 1 GB.
    """
    asize = parse_size(address_space_size, "address space size (-a)")
    psize = parse_size(phys_mem_size, "physical memory size (-p)")
    page = parse_size(page_size, "page size (-P)")
    for what, value in (("address space size (-a)", asize), ("physical memory size (-p)", psize)):
        if value >= MAX_SIZE:
            raise ValueError(f"{what} must be below 1g (as in OSTEP's simulator), got "
                             f"{format_size(value)}")
    _log2_exact(page, "page size (-P)")
    _log2_exact(asize, "address space size (-a)")
    if page > asize:
        raise ValueError(f"page size (-P {format_size(page)}) must not exceed the address space "
                         f"size (-a {format_size(asize)}): pick a smaller -P")
    if psize % page:
        raise ValueError(f"physical memory size (-p {format_size(psize)}) must be a multiple of the "
                         f"page size (-P {format_size(page)})")
    if psize <= asize:
        raise ValueError(f"physical memory size (-p {format_size(psize)}) must be larger than the "
                         f"address space size (-a {format_size(asize)}), as in OSTEP's simulator: "
                         "every valid page gets its own frame")
    num_vpages, num_frames = asize // page, psize // page
    if num_vpages > MAX_VIRTUAL_PAGES:
        raise ValueError(f"-a {format_size(asize)} with -P {format_size(page)} is {num_vpages} "
                         f"virtual pages, one printed line each; the limit is {MAX_VIRTUAL_PAGES}: "
                         "use a larger page size (-P) or a smaller address space (-a)")
    for name, value in (("used percent (-u)", used_percent), ("swapped percent (-w)", swapped_percent)):
        if not 0 <= value <= 100:
            raise ValueError(f"{name} must be within 0..100, got {value}")
    if addresses is None and not 0 <= num_addresses <= MAX_ADDRESSES:
        raise ValueError(f"number of addresses (-n) must be within 0..{MAX_ADDRESSES}, "
                         f"got {num_addresses}")
    for a in addresses or ():
        if not 0 <= a < asize:
            raise ValueError(f"address {a} (-A) is outside the {format_size(asize)} address space: "
                             f"use 0..{asize - 1}")

    rng = random.Random(seed)
    taken: set[int] = set()
    frames: list[int | None] = []
    for _ in range(num_vpages):
        while True:
            if rng.random() * 100 > 100 - used_percent:  # valid: find it a free frame
                frame = int(num_frames * rng.random())
                if frame in taken:
                    continue  # start this page over, both draws (OSTEP's order of draws)
                taken.add(frame)
                frames.append(frame)
            else:
                frames.append(None)
            break
    if addresses is None:
        addresses = [int(asize * rng.random()) for _ in range(num_addresses)]
    swap_rng = random.Random(f"swapped:{seed}")
    swapped = [swap_rng.random() * 100 < swapped_percent for _ in range(num_vpages)]
    entries = tuple(SWAPPED if f is not None and s else f for f, s in zip(frames, swapped, strict=True))
    table = LinearPageTable(page, entries)
    addresses = tuple(int(a) for a in addresses)
    args = {
        "seed": seed,
        "address space size": format_size(asize),
        "phys mem size": format_size(psize),
        "page size": format_size(page),
        "num addresses": len(addresses),
        "used percent": _plain(used_percent),
        "swapped percent": _plain(swapped_percent),
    }
    return LinearProblem(args, table, addresses, tuple(table.translate(a) for a in addresses))


def _plain(x: float) -> float | int:
    """70.0 -> 70, as the header echoes it; 12.5 stays."""
    return int(x) if float(x).is_integer() else x


def describe_entry(pfn: int | None) -> str:
    """How the notebooks and the command line name a linear-table entry."""
    if pfn is None:
        return "invalid"
    if pfn == SWAPPED:
        return "valid, not present (swapped out)"
    return f"valid, present, PFN {pfn}"


def answer_of(t: Translation) -> int | str:
    """What a student answers for one translation: the physical address, "segfault" or "page fault"."""
    return t.fault_kind if t.fault else t.paddr


# ---------------------------------------------------------------------------------------------
# two-level problems with a memory dump

ML_INVALID = 0x7F  # an invalid directory or table entry as stored in memory (valid bit clear)


@dataclass(frozen=True)
class MultilevelWalk:
    """One address walked through memory: directory entry, then table entry, then the data byte.
    Entries are one byte: bit 7 = valid, bits 0-6 = PFN (no present bit in this simulator)."""

    vaddr: int
    pd_index: int
    pt_index: int
    offset: int
    pde_addr: int
    pde: int
    pte_addr: int | None
    pte: int | None
    paddr: int | None
    value: int | None

    @property
    def fault(self) -> bool:
        return self.paddr is None


@dataclass(frozen=True)
class MultilevelProblem:
    """A 2-level table stored in a physical memory dump; ``pdbr`` is the directory's frame."""

    args: dict
    page_size: int
    va_bits: int
    pdbr: int
    memory: tuple[bytes, ...]  # one bytes object of page_size per physical frame
    mapping: dict  # vpn -> pfn, the truth the dump was built from
    addresses: tuple[int, ...]

    @property
    def index_bits(self) -> int:
        return _log2_exact(self.page_size, "page size")  # 1-byte entries: page_size per page

    def walk(self, vaddr: int) -> MultilevelWalk:
        """Translate by reading memory only, as the hardware (and the student) does."""
        if not 0 <= vaddr < 1 << self.va_bits:
            raise ValueError(f"virtual address {vaddr:#x} is outside the {self.va_bits}-bit space")
        bits = self.index_bits
        offset = vaddr & (self.page_size - 1)
        pt_index = (vaddr >> bits) & (self.page_size - 1)
        pd_index = vaddr >> (2 * bits)
        pde_addr = self.pdbr * self.page_size + pd_index
        pde = self.memory[self.pdbr][pd_index]
        if not pde & 0x80:
            return MultilevelWalk(vaddr, pd_index, pt_index, offset, pde_addr, pde, None, None,
                                  None, None)
        pt_frame = pde & 0x7F
        pte_addr = pt_frame * self.page_size + pt_index
        pte = self.memory[pt_frame][pt_index]
        if not pte & 0x80:
            return MultilevelWalk(vaddr, pd_index, pt_index, offset, pde_addr, pde, pte_addr, pte,
                                  None, None)
        frame = pte & 0x7F
        return MultilevelWalk(vaddr, pd_index, pt_index, offset, pde_addr, pde, pte_addr, pte,
                              frame * self.page_size + offset, self.memory[frame][offset])

    @property
    def linear_table_bytes(self) -> int:
        return (1 << (self.va_bits - self.index_bits)) * 1

    @property
    def two_level_bytes(self) -> int:
        """The directory page plus one page per table page that exists."""
        pieces = {vpn >> self.index_bits for vpn in self.mapping}
        return self.page_size * (1 + len(pieces))

    def dump(self, frames: list[int] | None = None) -> str:
        """The memory dump: one line of hex bytes per physical frame."""
        rows = range(len(self.memory)) if frames is None else frames
        return "\n".join(f"page {f:3d}: " + " ".join(f"{b:02x}" for b in self.memory[f])
                         for f in rows)


def random_multilevel_problem(seed: int, num_addresses: int = 5, code_pages: int = 6,
                              heap_pages: int = 10, stack_pages: int = 6,
                              phys_pages: int = 128) -> MultilevelProblem:
    """A 32 KiB address space (15-bit addresses) with 32-byte pages and 1-byte entries: 5 bits of
    directory index, 5 of table index, 5 of offset. The program has code at VPN 0, a heap a little
    above it and a stack at the top, as real address spaces do; everything else is unmapped.
    Unused frames hold random bytes, as a real memory does. Addresses hit mapped pages 4 times in 5.
    """
    page, va_bits = 32, 15
    num_vpages = 1 << (va_bits - 5)
    for name, n in (("code pages", code_pages), ("heap pages", heap_pages),
                    ("stack pages", stack_pages)):
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
    if code_pages + heap_pages + stack_pages > num_vpages // 2:
        raise ValueError("code + heap + stack must fit in half of the 1024 virtual pages")
    if not 2 <= phys_pages <= 128:
        raise ValueError(f"physical pages must be within 2..128 (7-bit PFNs), got {phys_pages}")
    rng = random.Random(seed)
    heap_start = code_pages + rng.randrange(0, 64)  # a gap between code and heap
    vpns = (list(range(code_pages)) + list(range(heap_start, heap_start + heap_pages))
            + list(range(num_vpages - stack_pages, num_vpages)))
    pieces = sorted({v >> 5 for v in vpns})
    needed = 1 + len(pieces) + len(vpns)
    if needed > phys_pages:
        raise ValueError(f"{needed} pages (directory, tables, data) do not fit in {phys_pages} "
                         "physical pages: use more physical pages (-p) or fewer mapped pages")
    frames = rng.sample(range(phys_pages), needed)
    pdbr, table_frames, data_frames = frames[0], frames[1:1 + len(pieces)], frames[1 + len(pieces):]
    memory = [bytearray(rng.randrange(256) for _ in range(page)) for _ in range(phys_pages)]
    memory[pdbr][:] = bytes([ML_INVALID] * page)
    for piece, frame in zip(pieces, table_frames, strict=True):
        memory[pdbr][piece] = 0x80 | frame
        memory[frame][:] = bytes([ML_INVALID] * page)
    mapping = dict(zip(vpns, data_frames, strict=True))
    for vpn, frame in mapping.items():
        memory[table_frames[pieces.index(vpn >> 5)]][vpn & 31] = 0x80 | frame
    addresses = []
    for _ in range(num_addresses):
        vpn = rng.choice(vpns) if rng.random() < 0.8 else rng.randrange(num_vpages)
        addresses.append(vpn * page + rng.randrange(page))
    args = {"seed": seed, "page size": page, "address bits": va_bits, "phys pages": phys_pages,
            "code pages": code_pages, "heap pages": heap_pages, "stack pages": stack_pages,
            "num addresses": num_addresses}
    return MultilevelProblem(args, page, va_bits, pdbr, tuple(bytes(m) for m in memory),
                             mapping, tuple(addresses))


# ---------------------------------------------------------------------------------------------
# replacement: a trace with Belady's anomaly


def belady_trace(seed: int, frames: int = 3, length: int = 20, num_pages: int = 6) -> list[int]:
    """A seeded random trace on which FIFO misses MORE with ``frames + 1`` frames than with ``frames``
    (Belady's anomaly). Found by search: such traces are rare (about 1 in 2000 at the defaults)."""
    rng = random.Random(seed)
    for _ in range(200_000):
        trace = [rng.randint(1, num_pages) for _ in range(length)]
        small = simulate_policy(trace, frames, "FIFO").num_misses
        if simulate_policy(trace, frames + 1, "FIFO").num_misses > small:
            return trace
    raise ValueError("no anomalous trace found: try another seed or a longer trace")

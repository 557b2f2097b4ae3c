"""Seeded paging problems and the exercises built on them, in the style of the OSTEP homework.

Owns the random (but seeded) linear problem (the one OSTEP's paging-linear-translate.py draws), the
two-level problem with a physical memory dump and a page-directory base register, and the notebook 01
exercises (translate, walk a dump, TLB hits, hit/miss strings, Belady's anomaly, why page size sets
the table's size) and its implement-it task (translate through a linear table). The same seed always
gives the same problem, here and on the command line (``Exercise.command``). Never prints a solution
by itself.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from simulators.exercises import Exercise, ImplementIt, Verdict, parse_int
from simulators.paging import (
    POLICIES,
    SWAPPED,
    LinearPageTable,
    Translation,
    _log2_exact,
    array_walk_vpns,
    encode_pte,
    format_size,
    parse_size,
    simulate_policy,
    simulate_tlb,
    translate_ptes,
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


def make_exercise(seed: int) -> Exercise:
    """Translate one address by hand (16 KiB space, 4 KiB pages). Answer with the physical address
    (an int), ``"segfault"`` (invalid page) or ``"page fault"`` (valid but swapped out)."""
    problem = random_linear_problem(seed, "16k", "64k", "4k", 1, 60, 25)
    table, t = problem.table, problem.answers[0]
    lines = [f"Page size {problem.args['page size']} ({table.page_size} bytes). Page table:"]
    for vpn, pfn in enumerate(table.entries):
        lines.append(f"  VPN {vpn:3d}: {describe_entry(pfn)}")
    lines.append(f"Translate virtual address {t.vaddr:#06x} (decimal {t.vaddr}).")
    lines.append('Answer with the physical address (an int), "segfault" or "page fault".')
    solution = answer_of(t)

    def diagnose(answer) -> Verdict:
        if isinstance(answer, str) and answer.strip().lower() in ("segfault", "page fault", "fault"):
            said = answer.strip().lower()
            if not t.fault:
                return Verdict(False, f"VPN {t.vpn} is valid and present; translate it.")
            if said == "fault":
                return Verdict(False, "it does fault, but which fault? An invalid page is a "
                                      "segfault, a valid page that is not present is a page fault.")
            if said == t.fault_kind:
                why = ("is invalid: the program never allocated it" if said == "segfault" else
                       "is valid but not present: the OS loads it from disk and retries")
                return Verdict(True, f"VPN {t.vpn} {why}.")
            return Verdict(False, f"look again at VPN {t.vpn}'s valid and present bits.")
        value = parse_int(answer)
        if value is None:
            return Verdict(False, 'answer with an int (a physical address), "segfault" or "page fault".')
        if t.fault:
            return Verdict(False, f"the address is on VPN {t.vpn}: read that entry again.")
        if value == t.paddr:
            return Verdict(True, f"VPN {t.vpn} -> PFN {t.pfn}; the offset {t.offset:#x} is kept.")
        if value & (table.page_size - 1) != t.offset:
            return Verdict(False, f"the offset is copied unchanged: yours is "
                                  f"{value & (table.page_size - 1):#x}, the address's is "
                                  f"{t.offset:#x}.")
        return Verdict(False, f"the offset is right, but frame {value // table.page_size} is not "
                              f"the one the entry for VPN {t.vpn} holds.")

    return Exercise(seed, "\n".join(lines), solution, diagnose,
                    hint="split the address into VPN (address // 4096) and offset, then read "
                         "the VPN's entry.",
                    command=f"python -m simulators.paging translate -s {seed} -n 1 -u 60 -w 25")


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


def make_multilevel_exercise(seed: int) -> Exercise:
    """Walk a two-level table in a memory dump. Answer with the physical address or ``"fault"``."""
    problem = random_multilevel_problem(seed, num_addresses=1, phys_pages=32)
    w = problem.walk(problem.addresses[0])
    question = "\n".join([
        "32-byte pages, 15-bit virtual addresses: 5 bits directory index | 5 bits table index | "
        "5 bits offset.",
        "Entries are one byte: bit 7 = valid, bits 0-6 = PFN. There is no present bit here.",
        f"PDBR (the page directory's frame): {problem.pdbr}",
        problem.dump(),
        f"Translate virtual address {w.vaddr:#06x}. Answer with the physical address or \"fault\".",
    ])
    solution = "fault" if w.fault else w.paddr

    def diagnose(answer) -> Verdict:
        if isinstance(answer, str) and answer.strip().lower() in ("fault", "segfault"):
            if w.fault:
                level = "directory" if w.pte is None else "table"
                return Verdict(True, f"the {level} entry is {(w.pte if w.pte is not None else w.pde):#04x}:"
                                     " its valid bit is clear.")
            return Verdict(False, f"both entries on the way are valid: the directory entry at "
                                  f"index {w.pd_index} is {w.pde:#04x}.")
        value = parse_int(answer)
        if value is None:
            return Verdict(False, 'answer with an int (a physical address) or "fault".')
        if w.fault:
            return Verdict(False, f"read the directory entry at index {w.pd_index} of page "
                                  f"{problem.pdbr}, then check each valid bit.")
        if value == w.paddr:
            return Verdict(True, f"PDE[{w.pd_index}] = {w.pde:#04x} -> table page {w.pde & 0x7F}; "
                                 f"PTE[{w.pt_index}] = {w.pte:#04x} -> frame {w.pte & 0x7F}; "
                                 f"+ offset {w.offset}.")
        if value & 31 != w.offset:
            return Verdict(False, f"the low 5 bits (the offset, {w.offset}) are copied unchanged.")
        if value >> 5 == w.pde & 0x7F:
            return Verdict(False, "that frame is the page table, not the data: read the table "
                                  "entry inside it.")
        return Verdict(False, "the offset is right; check the indices: directory index = "
                              "address >> 10, table index = (address >> 5) & 31.")

    return Exercise(seed, question, solution, diagnose,
                    hint="split the address into 5 + 5 + 5 bits; the directory is page PDBR.",
                    command=f"python -m simulators.paging multilevel -s {seed} -n 1 -p 32")


# ---------------------------------------------------------------------------------------------
# TLB and replacement exercises


def make_tlb_exercise(seed: int) -> Exercise:
    """How many TLB hits does a loop over an array get? Answer with an int."""
    rng = random.Random(seed)
    page = rng.choice([16, 32, 64])
    element = rng.choice([4, 8])
    count = rng.randint(8, 24)
    base = rng.randrange(0, 4 * page, element)
    passes = rng.choice([1, 2])
    entries = rng.choice([2, 4, 8])
    vpns = array_walk_vpns(base, element, count, page) * passes
    result = simulate_tlb(vpns, entries)
    distinct = len(set(vpns))
    question = (f"A loop reads {count} {element}-byte integers starting at virtual address {base}, "
                f"{passes} time(s) in a row. Pages are {page} bytes; the TLB has {entries} entries "
                f"(LRU) and starts empty.\nHow many of the {len(vpns)} accesses hit in the TLB?")

    def diagnose(answer) -> Verdict:
        value = parse_int(answer)
        if value is None:
            return Verdict(False, "answer with an int number of hits.")
        if value == result.hits:
            return Verdict(True, f"the array touches VPNs {sorted(set(vpns))}: {result.misses} misses, "
                                 f"{result.hits} hits ({result.hit_rate:.0%}).")
        if value == result.misses:
            return Verdict(False, "that is the number of misses; the question asks for hits.")
        if passes == 2 and value == len(vpns) - distinct:
            return Verdict(False, f"a second pass hits only if the pages are still in the TLB: "
                                  f"{distinct} pages, {entries} entries.")
        return Verdict(False, "list the VPN of each access ((base + i x size) // page size); the "
                              "first access to a page misses, repeats hit while it is cached.")

    return Exercise(seed, question, result.hits, diagnose,
                    hint="write the VPN of each access, then mark first touches as misses.")


def make_policy_exercise(seed: int) -> Exercise:
    """Predict the hit/miss string of one replacement policy, e.g. ``"mmmhmh"``."""
    rng = random.Random(seed)
    policy = POLICIES[seed % len(POLICIES)]
    frames = rng.choice([3, 4])
    trace = [rng.randint(0, 5) for _ in range(10)]
    result = simulate_policy(trace, frames, policy)
    solution = "".join("h" if h else "m" for h in result.hits)
    question = (f"Trace {' '.join(map(str, trace))}, {frames} frames, starting empty, policy {policy}.\n"
                "Write one letter per access: h for a hit, m for a miss (e.g. \"mmmh...\").")
    rule = {"FIFO": "evict the page loaded longest ago", "LRU": "evict the page used longest ago",
            "OPT": "evict the page whose next use is farthest away",
            "CLOCK": "sweep the hand, clearing use bits, evict the first frame whose bit is clear"}

    def diagnose(answer) -> Verdict:
        if not isinstance(answer, str):
            return Verdict(False, 'answer with a string of h and m, e.g. "mmmh".')
        text = answer.strip().lower().replace(" ", "")
        if len(text) != len(trace) or set(text) - {"h", "m"}:
            return Verdict(False, f"give exactly {len(trace)} letters, each h or m.")
        if text == solution:
            return Verdict(True, f"{result.num_hits} hits, {result.num_misses} misses; evictions: "
                                 f"{[e for e in result.evicted if e is not None]}.")
        i = next(k for k in range(len(trace)) if text[k] != solution[k])
        state = list(result.resident[i - 1]) if i else []
        return Verdict(False, f"access {i + 1} (page {trace[i]}) is the first that differs: memory "
                              f"then held {state}; {policy}: {rule[policy]}.")

    return Exercise(seed, question, solution, diagnose,
                    hint="track the resident pages after each access; first touches always miss.",
                    command=(f"python -m simulators.paging policy -p {policy} -C {frames} "
                             f"-A {','.join(map(str, trace))}"))


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


def make_belady_exercise(seed: int) -> Exercise:
    """Count FIFO's misses with 3 and with 4 frames on an anomalous trace: answer ``(m3, m4)``."""
    trace = belady_trace(seed)
    m3, m4 = (simulate_policy(trace, f, "FIFO").num_misses for f in (3, 4))
    l3, l4 = (simulate_policy(trace, f, "LRU").num_misses for f in (3, 4))
    question = (f"Trace {' '.join(map(str, trace))}, FIFO, starting empty.\n"
                "How many misses with 3 frames, and with 4? Answer a pair (misses_3, misses_4).")

    def diagnose(answer) -> Verdict:
        try:
            a3, a4 = (int(x) for x in answer)
        except (TypeError, ValueError):
            return Verdict(False, "answer with a pair of ints, e.g. (12, 13).")
        if (a3, a4) == (m3, m4):
            return Verdict(True, f"one more frame gives MORE misses ({m3} -> {m4}): Belady's anomaly. "
                                 f"LRU on the same trace: {l3} -> {l4}; LRU is a stack algorithm "
                                 "(what n frames hold, n + 1 frames also hold), FIFO is not.")
        if a3 == m3:
            return Verdict(False, "the 3-frame count is right; redo the 4-frame run from an empty memory.")
        if a4 == m4:
            return Verdict(False, "the 4-frame count is right; redo the 3-frame run from an empty memory.")
        return Verdict(False, "FIFO evicts the page LOADED longest ago, even if it was just used.")

    # no single command prints this pair: run `policy -p FIFO -A <trace> -c` with -C 3, then -C 4
    return Exercise(seed, question, (m3, m4), diagnose,
                    hint="simulate FIFO twice, once per frame count; a hit does not reorder FIFO.")


# ---------------------------------------------------------------------------------------------
# explain: page size and the linear table


def make_page_size_exercise(seed: int) -> Exercise:
    """OSTEP's homework question 1, as a choice: why does a bigger page shrink the linear table, and
    why not use huge pages? Answer with a letter."""
    rng = random.Random(seed)
    asize = rng.choice(["1m", "2m", "4m"])
    small, big = rng.choice([("1k", "2k"), ("1k", "4k"), ("2k", "4k")])
    n_small, n_big = (len(random_linear_problem(seed, asize, "512m", p, 0).table.entries)
                      for p in (small, big))
    right = ("each entry maps a bigger page, so fewer entries cover the space; but a region "
             "rarely fills its last page, and a bigger page wastes more of it")
    wrong = {
        "entry": ("a bigger page makes each entry smaller, so the table takes fewer bytes",
                  "every entry is still one 32-bit word (0x80000000 | PFN); what changed is how many "
                  "entries there are."),
        "valid": ("the table stores only the valid pages, and with bigger pages fewer are valid",
                  "a linear table has one entry per virtual page, valid or not: count the lines "
                  "-v prints, zeros included."),
        "physical": ("bigger pages leave fewer physical frames, and the table has one entry per frame",
                     "the table is indexed by VIRTUAL page number: -p is the same in both runs and "
                     "the entry count does not depend on it."),
    }
    options = [("right", right)] + [(k, text) for k, (text, _) in wrong.items()]
    rng.shuffle(options)
    letters = "abcd"
    solution = letters[[k for k, _ in options].index("right")]
    command = f"python -m simulators.paging translate -P {small} -a {asize} -p 512m -v -n 0"
    question = "\n".join(
        [f"`{command}` prints {n_small} entries; with -P {big} instead it prints {n_big}.",
         "Which sentence explains the change (and why we do not simply use really big pages)?"]
        + [f"  ({letter}) {text}" for letter, (_, text) in zip(letters, options, strict=True)]
        + ["Answer with a letter."])

    def diagnose(answer) -> Verdict:
        text = answer.strip().lower().strip("()") if isinstance(answer, str) else ""
        if len(text) != 1 or text not in letters:
            return Verdict(False, 'answer with one letter, "a" to "d".')
        key = options[letters.index(text)][0]
        if key == "right":
            return Verdict(True, f"{format_size(parse_size(asize))} / {small} = {n_small} entries, "
                                 f"/ {big} = {n_big}: entries = address space / page size. Half a "
                                 "page is wasted per region on average, so the waste grows with the "
                                 "page (notebook 02 meets the same trade-off as the KV block size).")
        return Verdict(False, wrong[key][1])

    # no `command`: the simulator prints the tables, not the letter
    return Exercise(seed, question, solution, diagnose,
                    hint="count the entries: how many virtual pages does the address space hold?")


# ---------------------------------------------------------------------------------------------
# implement it: translate through a linear table


def _show(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(f"{v:#x}" for v in value) + "]"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:#x} ({value})"
    return repr(value)


def make_translate_task(seed: int = 0) -> ImplementIt:
    """Implement ``translate(vaddr, page_table, page_size)``: the physical address, or None when the
    page is not valid. ``page_table`` lists the entries as the simulator prints them (0x80000000 | PFN,
    or 0). Seeded cases from OSTEP-style problems with several page sizes, valid and invalid pages."""
    rng = random.Random(seed)
    cases = []
    for i, (asize, psize, page) in enumerate([("16k", "64k", "4k"), ("16k", "32k", "1k"),
                                              ("32", "1024", "8"), ("1k", "4k", "128"),
                                              ("64k", "96k", "4k")]):
        problem = random_linear_problem(seed * 10 + i, asize, psize, page, 0, 50)
        ptes, size = problem.ptes(), problem.table.page_size
        valid = [v for v, p in enumerate(ptes) if p]
        invalid = [v for v, p in enumerate(ptes) if not p]
        vpns = rng.sample(valid, min(3, len(valid))) + rng.sample(invalid, min(1, len(invalid)))
        cases += [dict(vaddr=v * size + rng.randrange(size), page_table=ptes, page_size=size)
                  for v in vpns]
    return ImplementIt("translate", translate_ptes, cases, show=_show,
                       hint="vpn = vaddr // page_size, offset = vaddr % page_size; a valid entry "
                            "has bit 31 set and its low bits are the PFN; PFN * page_size + offset.")

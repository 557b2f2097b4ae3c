"""The notebook 01 exercises on paging and its implement-it task, built on the seeded problems of
simulators/paging_problems.py in the style of the OSTEP homework.

Owns the exercises (translate one address, walk a memory dump, TLB hits, hit/miss strings, Belady's
anomaly, why page size sets the table's size) and the task (translate through a linear table). The
same seed always gives the same exercise, here and on the command line (``Exercise.command``). Never
prints a solution by itself.
"""

from __future__ import annotations

import random

from simulators.exercises import Exercise, ImplementIt, Verdict, parse_int
from simulators.paging import (
    POLICIES,
    array_walk_vpns,
    format_size,
    parse_size,
    simulate_policy,
    simulate_tlb,
    translate_ptes,
)
from simulators.paging_problems import (
    answer_of,
    belady_trace,
    describe_entry,
    random_linear_problem,
    random_multilevel_problem,
)


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
            return Verdict(False, 'answer with an int (a physical address), "segfault" or "page fault".',
                           attempt=False)
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
            return Verdict(False, 'answer with an int (a physical address) or "fault".', attempt=False)
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
            return Verdict(False, "answer with an int number of hits.", attempt=False)
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
    for _ in range(1000):  # a trace on which the frames matter: not all hits of an infinite memory,
        trace = [rng.randint(0, 5) for _ in range(10)]  # and not the string one frame fewer gives
        result = simulate_policy(trace, frames, policy)
        unbounded = [page in trace[:i] for i, page in enumerate(trace)]
        if list(result.hits) != unbounded and result.hits != simulate_policy(trace, frames - 1, policy).hits:
            break
    solution = "".join("h" if h else "m" for h in result.hits)
    question = (f"Trace {' '.join(map(str, trace))}, {frames} frames, starting empty, policy {policy}.\n"
                "Write one letter per access: h for a hit, m for a miss (e.g. \"mmmh...\").")
    rule = {"FIFO": "evict the page loaded longest ago", "LRU": "evict the page used longest ago",
            "OPT": "evict the page whose next use is farthest away",
            "CLOCK": "sweep the hand, clearing use bits, evict the first frame whose bit is clear"}

    def diagnose(answer) -> Verdict:
        if not isinstance(answer, str):
            return Verdict(False, 'answer with a string of h and m, e.g. "mmmh".', attempt=False)
        text = answer.strip().lower().replace(" ", "")
        if len(text) != len(trace) or set(text) - {"h", "m"}:
            return Verdict(False, f"give exactly {len(trace)} letters, each h or m.", attempt=False)
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
            return Verdict(False, "answer with a pair of ints, e.g. (12, 13).", attempt=False)
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
            return Verdict(False, 'answer with one letter, "a" to "d".', attempt=False)
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

"""The command line ``python -m simulators.paging``: seeded paging problems to solve by hand.

Owns what the four subcommands print and their options; the problems come from
``simulators.paging_problems``. Never prints an answer unless ``-c`` is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from simulators.cli_types import bounded_int, finite_float
from simulators.paging import parse_size, random_trace, simulate_policy
from simulators.paging_problems import (
    MAX_ADDRESSES,
    LinearProblem,
    MultilevelProblem,
    random_linear_problem,
    random_multilevel_problem,
)

# policy / tlb: a trace printed line by line, and frames / TLB entries; OPT scans ahead of each miss,
# so these bounds keep one run to seconds
MAX_TRACE, MAX_CACHE = 10_000, 1_000

DESCRIPTION = """\
Practice problems on paging, like the OSTEP homework simulators. Each run prints a problem; the
same seed (-s) always prints the same problem, and -c prints the answers too. Try a problem by hand
first, then check yourself with -c.

  translate   translate virtual addresses through a linear page table
  multilevel  walk a two-level page table stored in a memory dump
  policy      which accesses hit, which miss, under a page-replacement policy
  tlb         the same for a TLB (a small cache of translations)

Examples:
  python -m simulators.paging translate -s 1 -v
  python -m simulators.paging translate -P 1k -a 16k -p 32k -v -u 50 -c
  python -m simulators.paging multilevel -s 3 -n 1 -p 32
  python -m simulators.paging policy -p LRU -C 3 -A 0,1,2,0,1,3,0,3,1,2,1 -c
Run `python -m simulators.paging SUBCOMMAND --help` for the options of each.
"""


def _header(args: dict) -> str:
    return "\n".join(f"ARG {k} {v}" for k, v in args.items()) + "\n"


def _format_translation(t, compute: bool) -> str:
    head = f"  VA {t.vaddr:#010x} (decimal: {t.vaddr:8d}) --> "
    if not compute:
        return head + "PA or fault?"
    if t.fault_kind == "segfault":
        return head + f"segfault (VPN {t.vpn} is not valid)"
    if t.fault_kind == "page fault":
        return head + f"page fault (VPN {t.vpn} is valid but not present)"
    return head + f"{t.paddr:#010x} (decimal: {t.paddr:8d}) [VPN {t.vpn} -> PFN {t.pfn}]"


def render_translate(problem: LinearProblem, compute: bool, verbose: bool = False,
                     addresses: str = "-1") -> str:
    """The text the ``translate`` subcommand prints: OSTEP's page-table format (``-v`` adds each
    entry's VPN), then the addresses, and with ``compute`` their translations."""
    head = {**problem.args, "verbose": verbose, "addresses": addresses, "compute answers": compute}
    out = [_header(head)]
    if problem.present_bit:
        out.append("Linear page table, one entry per virtual page. Bit 31 is the VALID bit (the page")
        out.append("belongs to the program), bit 30 the PRESENT bit (the page is in memory, not on")
        out.append("disk); if both are set, the low bits are the physical frame number (PFN).")
    else:
        out.append("Linear page table, one entry per virtual page. The high-order bit (bit 31) is the")
        out.append("VALID bit: if it is 1, the rest of the entry is the physical frame number (PFN);")
        out.append("if it is 0, the page is not valid.")
    if not verbose:
        out.append("Use -v to print each entry's VPN beside it.")
    out.append("\nPage table (from entry 0 down to the max size)")
    for vpn, pte in enumerate(problem.ptes()):
        out.append(f"  [{vpn:8d}]  {pte:#010x}" if verbose else f"  {pte:#010x}")
    out.append("\nVirtual address trace")
    out.extend(_format_translation(t, compute) for t in problem.answers)
    if not compute:
        faults = '"segfault" (invalid page) or "page fault" (valid, not present)' \
            if problem.present_bit else "a segfault (invalid page)"
        out.append("\nFor each virtual address, give the physical address it translates to, or")
        out.append(f"say that it is {faults}. Add -c for the answers.")
    return "\n".join(out) + "\n"


def render_multilevel(problem: MultilevelProblem, compute: bool) -> str:
    """The text the ``multilevel`` subcommand prints: PDBR, the memory dump, the addresses."""
    out = [_header({**problem.args, "compute answers": compute})]
    out.append("Virtual address: 5 bits page-directory index | 5 bits page-table index | 5 bits offset.")
    out.append("Directory and table entries are one byte: bit 7 = valid, bits 0-6 = PFN (this")
    out.append("simulator has no present bit). The directory sits in physical page PDBR.\n")
    out.append(f"PDBR: {problem.pdbr}\n")
    out.append(problem.dump())
    out.append("\nVirtual address trace")
    for vaddr in problem.addresses:
        w = problem.walk(vaddr)
        head = f"  VA {vaddr:#06x} --> "
        if not compute:
            out.append(head + "physical address or fault?")
            continue
        steps = f"pde index {w.pd_index} [byte {w.pde:#04x}]"
        if w.pte is not None:
            steps += f", pte index {w.pt_index} [byte {w.pte:#04x}]"
        if w.fault:
            out.append(head + f"{steps} --> fault")
        else:
            out.append(head + f"{steps} --> PA {w.paddr:#06x} (value {w.value:#04x})")
    if compute:
        out.append(f"\nTable memory: linear {problem.linear_table_bytes} B, "
                   f"two-level {problem.two_level_bytes} B")
    return "\n".join(out) + "\n"


def render_policy(trace: Sequence[int], frames: int, policy: str, args: dict,
                  compute: bool) -> str:
    """The text the ``policy`` and ``tlb`` subcommands print."""
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


def _size(flag: str):
    """An argparse type: a size such as 16k, or an error that argparse prefixes with the flag."""
    def parse(text: str) -> int:
        try:
            return parse_size(text, what="")
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    parse.__name__ = f"size ({flag})"
    return parse


def _addresses(text: str) -> list[int] | None:
    """``-A``: None for "-1" (random addresses), else decimal or 0x-hex addresses."""
    if text.strip() == "-1":
        return None
    try:
        return [int(x.strip(), 0) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"-A wants comma-separated virtual addresses such as 0x3229,4969, "
                         f"got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulators.paging", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    fmt = argparse.ArgumentDefaultsHelpFormatter

    def answers(p):
        p.add_argument("-c", "--compute", action="store_true",
                       help="print the answers too (solve it by hand first)")

    tr = sub.add_parser("translate", formatter_class=fmt, help="linear page-table translation",
                        description="Translate virtual addresses through a linear page table. "
                                    "Takes the flags of OSTEP's paging-linear-translate.py and "
                                    "prints the same page table and addresses for the same seed; "
                                    "-w (swapped-out pages) is ours.")
    tr.add_argument("-s", "--seed", type=int, default=0, help="problem number: same seed, same problem")
    tr.add_argument("-a", "--asize", default="16k", type=_size("-a"),
                    help="size of the virtual address space: a power of two below 1g (16k, 1m, ...)")
    tr.add_argument("-p", "--physmem", default="64k", type=_size("-p"),
                    help="size of physical memory: a multiple of the page size, larger than -a, below 1g")
    tr.add_argument("-P", "--pagesize", default="4k", type=_size("-P"), help="page size (a power of two)")
    tr.add_argument("-n", "--numaddrs", type=int, default=5,
                    help="how many random addresses to translate")
    tr.add_argument("-A", "--addresses", default="-1",
                    help="your own comma-separated virtual addresses, e.g. 0x3229,4969 "
                         "(replaces -n; -1 means random ones)")
    tr.add_argument("-u", "--used", type=finite_float(0, 100), default=50,
                    help="percent of virtual pages that are valid (belong to the program)")
    tr.add_argument("-w", "--swapped", type=finite_float(0, 100), default=0,
                    help="percent of valid pages that are swapped out (valid, not present); "
                         "above 0 the entries gain a PRESENT bit (bit 30)")
    tr.add_argument("-v", "--verbose", action="store_true",
                    help="print each page-table entry's VPN beside it")
    answers(tr)

    ml = sub.add_parser("multilevel", formatter_class=fmt, help="two-level page-table walk",
                        description="Walk a two-level page table in a memory dump: 32 KiB address "
                                    "space, 32-byte pages, code at the bottom, heap above it, stack "
                                    "at the top.")
    ml.add_argument("-s", "--seed", type=int, default=0, help="problem number: same seed, same problem")
    ml.add_argument("-n", "--numaddrs", type=bounded_int(0, MAX_ADDRESSES), default=5,
                    help="how many addresses to translate")
    ml.add_argument("-p", "--physpages", type=int, default=128, help="physical pages (2..128)")
    ml.add_argument("--code", type=int, default=6, help="pages of code, from virtual page 0")
    ml.add_argument("--heap", type=int, default=10, help="pages of heap, a little above the code")
    ml.add_argument("--stack", type=int, default=6, help="pages of stack, at the top of the space")
    answers(ml)

    for name, helptext, what, default_policy in (
            ("policy", "page replacement", "frames of physical memory", "FIFO"),
            ("tlb", "TLB hits and misses", "TLB entries", "LRU")):
        p = sub.add_parser(name, formatter_class=fmt, help=helptext,
                           description=f"Hits and misses of {helptext.lower()} over a trace of "
                                       "page numbers, starting empty.")
        p.add_argument("-s", "--seed", type=int, default=0, help="seed of the random trace")
        p.add_argument("-n", "--numaddrs", type=bounded_int(0, MAX_TRACE), default=10,
                       help="length of the random trace")
        p.add_argument("-m", "--maxpage", type=bounded_int(0, 2**31 - 1), default=10,
                       help="largest page number in the trace")
        p.add_argument("-A", "--addresses", default="",
                       help="your own comma-separated trace, e.g. 1,2,3,1 (replaces -s, -n, -m)")
        p.add_argument("-C", "--cachesize", type=bounded_int(1, MAX_CACHE), default=3, help=what)
        p.add_argument("-p", "--policy", default=default_policy, help="FIFO, LRU, OPT or CLOCK")
        answers(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command == "translate":
            problem = random_linear_problem(ns.seed, ns.asize, ns.physmem, ns.pagesize,
                                            ns.numaddrs, ns.used, ns.swapped,
                                            _addresses(ns.addresses))
            print(render_translate(problem, ns.compute, ns.verbose, ns.addresses), end="")
        elif ns.command == "multilevel":
            problem = random_multilevel_problem(ns.seed, ns.numaddrs, ns.code, ns.heap, ns.stack,
                                                ns.physpages)
            print(render_multilevel(problem, ns.compute), end="")
        else:
            if ns.addresses:
                try:
                    trace = [int(x) for x in ns.addresses.split(",")]
                except ValueError:
                    raise ValueError(f"-A wants comma-separated page numbers, got {ns.addresses!r}") from None
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

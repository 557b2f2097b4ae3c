"""The command line ``python -m simulators.kv_memory``: KV-cache exercises and the policy comparison.

Owns what its three subcommands print; the numbers come from ``kv_memory``, ``kv_allocator`` and
``kv_exercises``. Never prints an exercise's answer unless ``-c`` is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from simulators.cli_types import bounded_int

DESCRIPTION = """\
KV-cache memory, from the command line (notebook 02 runs the same functions).

  bytes    a seeded config: how many bytes of KV does one token take?
  fit      how many requests fit when each reserves max_model_len slots?
  compare  contiguous reservation against paged blocks on a synthetic workload

Examples:
  python -m simulators.kv_memory bytes -s 3
  python -m simulators.kv_memory bytes -s 3 --dtype float8 -c
  python -m simulators.kv_memory compare --workload sharegpt
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulators.kv_memory", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    fmt = argparse.ArgumentDefaultsHelpFormatter
    b = sub.add_parser("bytes", formatter_class=fmt, help="KV bytes per token of a seeded config")
    b.add_argument("-s", "--seed", type=int, default=0, help="problem number: same seed, same problem")
    b.add_argument("--dtype", default=None, help="force the KV dtype (e.g. float8); default: drawn")
    b.add_argument("-c", "--compute", action="store_true", help="print the answer too")
    f = sub.add_parser("fit", formatter_class=fmt, help="how many max_model_len reservations fit")
    f.add_argument("-s", "--seed", type=int, default=0, help="problem number: same seed, same problem")
    f.add_argument("-c", "--compute", action="store_true", help="print the answer too")
    c = sub.add_parser("compare", formatter_class=fmt, help="reservation policies against paging")
    c.add_argument("--workload", choices=("sharegpt", "alpaca"), default="sharegpt",
                   help="synthetic lengths with the paper's mean prompt/output lengths")
    c.add_argument("-n", "--requests", type=bounded_int(1, 10_000), default=1000,
                   help="number of requests")
    c.add_argument("-s", "--seed", type=int, default=0, help="seed of the workload")
    c.add_argument("--budget", type=bounded_int(1, 1 << 40), default=15_728,
                   help="KV budget in token slots (15,728 = 12 GiB of OPT-13B KV)")
    c.add_argument("--block-size", type=bounded_int(1, 1 << 20), default=16,
                   help="block size of the paged policy")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from simulators import kv_exercises
    from simulators.kv_allocator import compare_policies
    from simulators.kv_memory import ALPACA_LIKE, SHAREGPT_LIKE, sample_workload

    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command in ("bytes", "fit"):
            ex = (kv_exercises.make_exercise(ns.seed, ns.dtype) if ns.command == "bytes"
                  else kv_exercises.make_fit_exercise(ns.seed))
            print(ex.question)
            if ns.compute:
                print(f"ANSWER {ex.solution()}")
        else:
            spec = SHAREGPT_LIKE if ns.workload == "sharegpt" else ALPACA_LIKE
            if ns.requests < 1:
                raise ValueError("--requests must be >= 1")
            w = sample_workload(spec, ns.requests, ns.seed)
            print(f"{spec.name}, {ns.requests} requests (seed {ns.seed}), budget {ns.budget} slots")
            print(f"{'policy':22s} {'tokens':>7s} {'reserv.':>7s} {'internal':>8s} {'external':>8s} "
                  f"{'batch':>6s} {'preempt':>7s}")
            for name, r in compare_policies(w, ns.budget, ns.block_size).items():
                print(f"{name:22s} {r.token_share:7.1%} {r.reservation_share:7.1%} "
                      f"{r.internal_share:8.1%} {r.external_share:8.1%} {r.mean_running:6.1f} "
                      f"{r.num_preemptions:7d}")
    except ValueError as err:
        parser.error(str(err))
    return 0

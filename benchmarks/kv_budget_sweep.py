"""Paged vs contiguous KV on the ShareGPT-like workload across KV budgets: how the throughput ratio and
the peak-sequence ratio move with the memory the two layouts share. Each budget runs both layouts in one
process (``minirunner.tools.bench.run_bench`` with ``--compare contiguous``), repeated; medians are kept.

    python benchmarks/kv_budget_sweep.py --repeats 3 --out benchmarks/results

A budget is given as how many ``max_model_len`` reservations it holds (the contiguous layout's peak
batch): the paper's Table 1 setting is 7 (cpu_headlines.py's row).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from cpu_headlines import BLOCK, COMPARISONS, MAX_MODEL_LEN, command_line, spread

from minirunner.tools.bench import environment, run_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reservations", type=int, nargs="+", default=[3, 5, 7, 10, 14])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    base = dict(COMPARISONS["sharegpt_paged_vs_contiguous"], compare=["contiguous"])
    rows = []
    for n in args.reservations:
        kw = dict(base, num_kv_blocks=n * MAX_MODEL_LEN // BLOCK)
        print(f"== {n} reservations: {command_line(kw)}", flush=True)
        reports = [run_bench(device="cpu", **kw) for _ in range(args.repeats)]
        tok = [next(iter(r["ratios"].values()))["output_tok_per_s"] for r in reports]
        paged = [r["results"][0] for r in reports]
        contiguous = [r["results"][1] for r in reports]
        row = dict(reservations=n, num_kv_blocks=kw["num_kv_blocks"], command=command_line(kw),
                   tok_ratio=spread(tok),
                   peak_seqs_paged=statistics.median(p["peak_concurrent_seqs"] for p in paged),
                   peak_seqs_contiguous=statistics.median(c["peak_concurrent_seqs"] for c in contiguous),
                   paged_tok_per_s=statistics.median(p["output_tok_per_s"] for p in paged),
                   contiguous_tok_per_s=statistics.median(c["output_tok_per_s"] for c in contiguous),
                   preemptions_paged=statistics.median(p["num_preemptions"] for p in paged),
                   kv_util_paged=statistics.median(p["kv_utilization_mean"] for p in paged),
                   kv_util_contiguous=statistics.median(c["kv_utilization_mean"] for c in contiguous))
        rows.append(row)
        print(f"-> {n} reservations: tok/s x{row['tok_ratio']['median']:.2f} "
              f"({row['tok_ratio']['min']:.2f}-{row['tok_ratio']['max']:.2f}), peak sequences "
              f"{row['peak_seqs_paged']} vs {row['peak_seqs_contiguous']}, paged preemptions "
              f"{row['preemptions_paged']}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kv_budget_sweep.json").write_text(json.dumps(
        dict(environment=environment(), repeats=args.repeats, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()

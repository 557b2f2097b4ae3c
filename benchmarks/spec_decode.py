"""Speculative decoding on the embedded pair at batch 1, side by side in one run: each proposer (draft
model, n-gram) against plain decoding of the same runner, and transformers' assisted generation (the same
draft, or its n-gram prompt lookup) against transformers' own generate, on the same prompts. Every figure
comes from ``minirunner bench`` (``run_bench``); this script repeats it, keeps medians, writes JSON.

    python benchmarks/spec_decode.py --repeats 3 --out benchmarks/results/spec_decode_cpu.json

CPU and eager (graph_mode="none") by default; ``--device cuda --graph-mode cuda`` is the GPU check's run
(scripts/gpu_check.sh). The exact ``minirunner bench`` command of each case is printed and stored.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from minirunner.tools.bench import environment, format_table, run_bench

WORKLOADS = ("text", "repetitive")
METHODS = ("draft_model", "ngram")


def case(workload: str, method: str, k: int, max_tokens: int, num_requests: int, device: str,
         graph_mode: str, num_threads, lookup_max: int = 4, warmup: str = "short",
         async_scheduling: bool = False) -> dict:
    """``async_scheduling`` (draft model only; n-gram lookup reads the tokens on the host): that run, with
    the synchronous speculative runner beside it."""
    spec = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        spec.update(prompt_lookup_min=1, prompt_lookup_max=lookup_max)
    ahead = async_scheduling and method == "draft_model"
    compare = ["plain", "transformers", "transformers_assisted"] + (["synchronous"] if ahead else [])
    return dict(workload=workload, num_requests=num_requests, output_len=(max_tokens, max_tokens),
                max_num_seqs=1, hf_batch_size=1, speculative_config=spec, device=device,
                graph_mode=graph_mode, num_threads=num_threads, warmup=warmup, async_scheduling=ahead,
                compare=compare)


def command_line(kw: dict) -> str:
    out, k = kw["output_len"][0], kw["speculative_config"]
    return (f"minirunner bench --device {kw['device']} --graph-mode {kw['graph_mode']} "
            f"--num-threads {kw['num_threads']} --warmup {kw['warmup']} "
            f"--workload {kw['workload']} --num-requests {kw['num_requests']} "
            f"--output-len {out} {out} --max-num-seqs 1 --hf-batch-size 1 --speculative-config "
            f"'{json.dumps(k)}' --compare plain --compare transformers --compare transformers_assisted"
            + (" --async-scheduling --compare synchronous" if kw["async_scheduling"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3, help="draft tokens of the draft model")
    # vLLM's documented n-gram example: 5 tokens, lookup up to 4-grams. The lookup costs no model pass
    # (c ~ 0.006 measured), so a longer guess pays where a match continues.
    ap.add_argument("--ngram-k", type=int, default=5, help="draft tokens of the n-gram proposer")
    ap.add_argument("--ngram-lookup-max", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-threads", default="auto",
                    help="torch CPU threads (auto: one per core; 1 holds up better on a shared machine)")
    ap.add_argument("--graph-mode", default="none", choices=["none", "cuda", "compile"])
    # workload: every engine runs the whole workload once, untimed, before its timed run (steady
    # state); short: two short requests (minirunner bench --warmup)
    ap.add_argument("--warmup", default="short", choices=["short", "workload"])
    ap.add_argument("--async-scheduling", action="store_true",
                    help="draft model: schedule each step ahead (needs --graph-mode cuda or compile), "
                         "the synchronous run beside it")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--out", default="benchmarks/results/spec_decode_cpu.json")
    args = ap.parse_args()
    summary = dict(environment=environment(), repeats=args.repeats, warmup=args.warmup, k=args.k,
                   ngram_k=args.ngram_k, ngram_lookup_max=args.ngram_lookup_max, device=args.device,
                   graph_mode=args.graph_mode, cases={})
    for workload in args.workloads:
        for method in args.methods:
            threads = args.num_threads if args.num_threads == "auto" else int(args.num_threads)
            k = args.ngram_k if method == "ngram" else args.k
            kw = case(workload, method, k, args.max_tokens, args.num_requests, args.device,
                      args.graph_mode, threads, args.ngram_lookup_max, args.warmup,
                      args.async_scheduling)
            print(f"== {workload} / {method}: {command_line(kw)}", flush=True)
            reports = [run_bench(**kw) for _ in range(args.repeats)]
            for r in reports:
                print(format_table(r), flush=True)

            def med(values):
                return dict(median=statistics.median(values), min=min(values), max=max(values))
            labels = [r["label"] for r in reports[0]["results"]]
            row = dict(
                command=command_line(kw),
                speedup_vs_plain=med([r["ratios"][labels[1]]["output_tok_per_s"] for r in reports]),
                hf_assisted_speedup=med([r["transformers_assisted_speedup"]["output_tok_per_s"]
                                         for r in reports]),
                output_tok_per_s={lab: med([r["results"][i]["output_tok_per_s"] for r in reports])
                                  for i, lab in enumerate(labels)},
                alpha=med([r["results"][0]["speculative"]["alpha"] for r in reports]),
                mean_accepted_length=med([r["results"][0]["speculative"]["mean_accepted_length"]
                                          for r in reports]),
                # c: one draft token's proposer time over one verify pass (the spec steps only)
                cost_ratio_c=med([_cost_ratio(r["results"][0]["speculative"]) for r in reports]))
            if kw["async_scheduling"]:  # the synchronous run is the last one
                row["speedup_vs_synchronous"] = med([r["ratios"][labels[-1]]["output_tok_per_s"]
                                                     for r in reports])
            summary["cases"][f"{workload}/{method}"] = row
            ahead = row.get("speedup_vs_synchronous")
            print(f"-> {workload}/{method}: x{row['speedup_vs_plain']['median']:.2f} vs plain decoding; "
                  f"transformers assisted x{row['hf_assisted_speedup']['median']:.2f}; alpha "
                  f"{row['alpha']['median']:.2f}, c {row['cost_ratio_c']['median']:.3f}"
                  + (f"; scheduled ahead x{ahead['median']:.2f} vs synchronous" if ahead else ""),
                  flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


def _cost_ratio(stats: dict) -> float | None:
    steps, drafts = stats["num_steps"], stats["num_draft_tokens"]
    return (stats["propose_s"] / drafts) / (stats["verify_s"] / steps) if steps and drafts else None


if __name__ == "__main__":
    main()

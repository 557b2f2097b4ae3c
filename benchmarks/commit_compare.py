"""Two commits side by side on this machine: minirunner's output tok/s on cpu_headlines.py's two workloads
(batch 1; 64 ragged requests), on speculative decoding at batch 1 (the embedded draft model, k = 3, two
text prompts) and at batch 8 with one request asking for logprobs (draft model on text; n-gram on
the repetitive passage), and the eager / compiled decode step
times of benchmarks/graphs.py, each commit in its own worktree and process, alternating, repeated;
medians, ranges and pairwise ratios.

    python benchmarks/commit_compare.py --old 7fb47e7 --new HEAD --pairs 5 \\
        --out benchmarks/results/mrv2_old_vs_new_cpu.json

``--cores 1`` pins every run to one core (taskset), so ``num_threads="auto"`` gives one thread and the
two commits meet the same machine. ``--async-new`` also runs the new commit with async_scheduling=True.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, sys
from minirunner.tools.bench import run_bench
kw = json.loads(sys.argv[1])
one = run_bench(device="cpu", compare=[], workload="fixed", num_requests=1, input_len=(32, 32),
                output_len=(200, 200), **kw)
many = run_bench(device="cpu", compare=[], workload="nano", num_requests=64, input_len=(8, 96),
                 output_len=(16, 160), **kw)
spec = run_bench(device="cpu", compare=[], workload="text", num_requests=2, output_len=(96, 96),
                 speculative_config={"method": "draft_model", "num_speculative_tokens": 3}, **kw)
# batches of 8 speculated requests (k = 3), one asking for logprobs=1: that request's options used to
# switch speculation off for the whole batch. The draft model on text; n-gram on the repetitive passage.
import time
from minirunner import LLM, SamplingParams
from minirunner.tools.bench.workloads import REPETITIVE_PROMPTS, TEXT_PROMPTS
params = [SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, logprobs=1 if i == 0 else None)
          for i in range(8)]
rows = {}
for name, spec_cfg, texts in (
        ("spec_batch8_one_logprobs", {"method": "draft_model"}, TEXT_PROMPTS),
        ("ngram_batch8_one_logprobs", {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4},
         REPETITIVE_PROMPTS)):
    llm = LLM(speculative_config={**spec_cfg, "num_speculative_tokens": 3}, device="cpu", **kw)
    prompts = [texts[i % 4] for i in range(8)]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    rows[name] = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)
print(json.dumps(dict(batch1=one["results"][0]["output_tok_per_s"],
                      ragged64=many["results"][0]["output_tok_per_s"],
                      spec_batch1=spec["results"][0]["output_tok_per_s"], **rows)))
"""


def _run(tree: Path, cores: str | None, args: list[str]) -> str:
    cmd = ([] if cores is None else ["taskset", "-c", cores]) + [sys.executable, *args]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout


def measure(tree: Path, cores: str | None, steps: int, llm_kwargs: dict, graphs: bool) -> dict:
    out = json.loads(_run(tree, cores, ["-c", PROBE, json.dumps(llm_kwargs)]).strip().splitlines()[-1])
    if graphs:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "graphs.json"
            _run(tree, cores, ["benchmarks/graphs.py", "--steps", str(steps), "--batches", "1", "8",
                               "--out", str(path)])
            report = json.loads(path.read_text())
        for b in ("1", "8"):
            for mode in ("none", "compile"):
                name = "eager" if mode == "none" else "compile"
                out[f"graph_b{b}_{name}_ms"] = report["batches"][b][mode]["median_step_ms"]
    return out


def summarise(runs: dict[str, list[dict]], base: str = "old") -> dict:
    figures = sorted(runs[base][0])
    table = {}
    for label, rows in runs.items():
        for f in figures:
            values = [r[f] for r in rows if f in r]
            if not values:
                continue
            entry = table.setdefault(f, {})
            entry[label] = dict(median=statistics.median(values), min=min(values), max=max(values))
            if label != base and len(values) == len(rows):
                ratios = [r[f] / o[f] for r, o in zip(rows, runs[base], strict=True)]
                entry[f"{label}/{base}"] = dict(pairwise_median=statistics.median(ratios), min=min(ratios),
                                                max=max(ratios))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="graphs.py timed steps per batch")
    ap.add_argument("--cores", default="1", help="taskset core list ('' for none)")
    ap.add_argument("--no-graphs", action="store_true", help="skip benchmarks/graphs.py")
    ap.add_argument("--async-new", action="store_true", help="also the new commit with async scheduling")
    ap.add_argument("--out", default="benchmarks/results/commit_compare_cpu.json")
    args = ap.parse_args()
    cores = args.cores or None
    work = Path(tempfile.mkdtemp(prefix="commit_compare_"))
    trees = {}
    for label, rev in (("old", args.old), ("new", args.new)):
        trees[label] = work / label
        subprocess.run(["git", "worktree", "add", "--detach", str(trees[label]), rev], cwd=ROOT, check=True,
                       capture_output=True)
    commits = {k: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=t, check=True,
                                 capture_output=True, text=True).stdout.strip() for k, t in trees.items()}
    jobs = [("old", "old", {}), ("new", "new", {})]
    if args.async_new:
        jobs.append(("new_async", "new", {"async_scheduling": True}))
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in jobs}
    try:
        for i in range(args.pairs):
            order = jobs if i % 2 == 0 else jobs[::-1]
            for label, tree, kw in order:
                r = measure(trees[tree], cores, args.steps, kw, graphs=not args.no_graphs and not kw)
                runs[label].append(r)
                print(f"pair {i + 1} {label}: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(r.items())),
                      flush=True)
    finally:
        for t in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(t)], cwd=ROOT, capture_output=True)
    report = dict(old_commit=commits["old"], new_commit=commits["new"], pairs=args.pairs,
                  cores=cores, command="python benchmarks/commit_compare.py " + " ".join(sys.argv[1:]),
                  note="alternating order per pair; ratios new/old per pair, then their median",
                  summary=summarise(runs), runs=runs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    for f, entry in report["summary"].items():
        print(f, {k: round(v.get("median", v.get("pairwise_median")), 3) for k, v in entry.items()})


if __name__ == "__main__":
    main()

"""Batch-invariant mode against the default on a CPU: output tok/s with the mode over without.

Workloads on the embedded model: 64 ragged requests (prompts of 8 to 120 tokens, outputs of 8 to 64,
greedy) and uniform batches of 1, 8 and 32 requests (16-token prompts, 64 output tokens each). Each is
run end to end through ``LLM.generate`` by two engines, mode off and on, in alternating pairs (off, on,
then on, off, ...), so a noisy shared machine slows both alike. The figure is the ratio
(mode on tok/s) / (mode off tok/s) per pair: median and range over ``--pairs`` pairs. Warm-up runs of
each workload go first and are not timed (with ``--compiled`` they compile the default engine's
buckets).

``--compiled``: the mode-off engine runs graph_mode="compile" (the mode runs every step eagerly, so
this compares the mode with the fastest default). ``--profile-batch1 N``: instead, N batch-1 decode
steps of each engine under cProfile, printing the seconds spent in the projections (FusedLinear calls,
which hold the mode's linear) and in the whole step.

    python benchmarks/batch_invariant.py --out benchmarks/results/batch_invariant_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

WORKLOADS = ("ragged64", "batch1", "batch8", "batch32")


def _workload(name: str):
    from minirunner import SamplingParams

    rng = random.Random(0)
    if name == "ragged64":
        prompts = [[rng.randrange(3, 1000) for _ in range(rng.randint(8, 120))] for _ in range(64)]
        params = [SamplingParams(temperature=0, max_tokens=rng.randint(8, 64), ignore_eos=True)
                  for _ in prompts]
    else:
        n = int(name.removeprefix("batch"))
        prompts = [[rng.randrange(3, 1000) for _ in range(16)] for _ in range(n)]
        params = [SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)] * n
    return prompts, params


def _tok_per_s(llm, prompts, params) -> float:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def profile_batch1(steps: int, threads: int) -> None:
    import cProfile
    import pstats

    from minirunner import LLM, SamplingParams

    for mode in (False, True):
        llm = LLM(device="cpu", batch_invariant=mode, num_threads=threads)
        engine = llm.engine
        engine.add_request(list(range(5, 21)), SamplingParams(temperature=0, max_tokens=steps + 40,
                                                               ignore_eos=True))
        for _ in range(20):  # the prefill and a warm-up
            engine.step()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            engine.step()
        prof.disable()
        stats = pstats.Stats(prof).stats
        linear = sum(v[3] for k, v in stats.items() if k[2] == "__call__" and k[0].endswith("decoder.py"))
        total = sum(v[3] for k, v in stats.items() if k[2] == "step" and k[0].endswith("engine.py"))
        print(f"batch_invariant={mode}: {steps} steps, projections {linear:.2f} s of {total:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    ap.add_argument("--compiled", action="store_true", help="the mode-off engine compiles its steps")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile-batch1", type=int, default=0, metavar="STEPS")
    args = ap.parse_args()
    if args.profile_batch1:
        profile_batch1(args.profile_batch1, args.threads)
        return
    from minirunner import LLM

    off_mode = "compile" if args.compiled else "none"
    engines = {"off": LLM(device="cpu", graph_mode=off_mode, num_threads=args.threads),
               "on": LLM(device="cpu", batch_invariant=True, num_threads=args.threads)}
    report = dict(threads=args.threads, default_graph_mode=off_mode, pairs=args.pairs,
                  load_before=[round(x, 2) for x in os.getloadavg()], workloads={})
    for name in args.workloads:
        prompts, params = _workload(name)
        for llm in engines.values():  # warm-up (compiles the default engine's buckets)
            _tok_per_s(llm, prompts, params)
        rates = {"off": [], "on": []}
        for i in range(args.pairs):
            for key in (("off", "on") if i % 2 == 0 else ("on", "off")):
                rates[key].append(_tok_per_s(engines[key], prompts, params))
        ratios = [on / off for on, off in zip(rates["on"], rates["off"], strict=True)]
        row = dict(off_tok_s=statistics.median(rates["off"]), on_tok_s=statistics.median(rates["on"]),
                   ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                   rates=rates)
        report["workloads"][name] = row
        print(f"{name:9s} off {row['off_tok_s']:8.1f} tok/s  on {row['on_tok_s']:8.1f} tok/s  "
              f"on/off {row['ratio_median']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]",
              flush=True)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

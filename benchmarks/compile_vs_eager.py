"""Compiled (``graph_mode="compile"``) against eager decode on a CPU, embedded model, one thread.

Three measurements, each in alternating pairs on one machine (eager, compiled, then compiled, eager, ...),
so a noisy shared machine slows both alike; every figure is a median with its range (min-max of the
per-pair ratios):

- decode step at batch 1, 8 and 32 (engine steps, greedy, 16-token prompts), the two
  engines taking turns of ``--block`` steps each; the ratio is per turn pair (median step of each turn).
  A turn of one step measures each engine just after the other evicted its code and data from the
  caches, which an engine running alone never meets (``--block 1`` gives that figure);
- the same decode steps in separate processes, one engine each (``decode_procs``): the processes alternate
  (eager, compiled, then compiled, eager, ...), each runs ``--steps`` steps after its warm-up and reports
  its median step; the ratio is per pair of processes. No engine evicts the other's weights and code from
  the caches here, as one engine serving alone never meets;
- 64 ragged requests end to end (``LLM.generate``, ragged prompt and output lengths; buckets 1, 2, 4 ... 64);
- warm start: a second process with the same compile cache, from ``LLM(...)`` to its first compiled step
  (seconds), beside the first (cold) process.

    python benchmarks/compile_vs_eager.py --out benchmarks/results/compile_vs_eager_cpu.json

Compiling happens in untimed warm-up passes (reported as ``warmup_s``), never inside the medians.
``--freezing`` compiles with inductor's freezing on (the A/B behind the default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PROMPT_LEN = 16
BATCHES = (1, 8, 32)


def _engine(mode: str, **kw):
    from minirunner import LLM

    # num_threads=1: LLM's "auto" would set one thread per core, which stalls on a shared machine
    return LLM(device="cpu", graph_mode=mode, num_threads=1, **kw)


def _summary(ratios: list[float]) -> dict:
    q = np.percentile(ratios, [25, 75])
    return dict(median=statistics.median(ratios), min=min(ratios), max=max(ratios),
                q25=float(q[0]), q75=float(q[1]), n=len(ratios))


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def decode_steps(batch: int, steps: int, warmup: int, engines: dict, block: int = 1) -> dict:
    """Median engine step (ms) of each engine at ``batch`` requests, and the eager/compiled ratio per pair
    of turns (each turn ``block`` steps of one engine; its median step)."""
    from minirunner import SamplingParams

    turns = max(1, steps // block)  # a block longer than ``steps`` still runs one turn of each engine
    params = SamplingParams(temperature=0.0, max_tokens=warmup + turns * block + 4, ignore_eos=True)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(PROMPT_LEN)] for i in range(batch)]
    warm = {}
    for name, llm in engines.items():
        for p in prompts:
            llm.engine.add_request(p, params)
        t0 = time.perf_counter()
        while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in llm.engine.requests.values()):
            llm.engine.step()
        for _ in range(warmup):  # the compiled engine compiles its bucket here
            llm.engine.step()
        warm[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in engines}
    cpu: dict[str, list[float]] = {name: [] for name in engines}  # this thread's CPU time
    for i in range(turns):
        order = list(engines) if i % 2 == 0 else list(reversed(engines))
        for name in order:
            for _ in range(block):
                t0, c0 = time.perf_counter(), time.thread_time()
                engines[name].engine.step()
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
    for llm in engines.values():
        timed = list(llm.engine.trace)[-turns * block:]
        assert all(t.num_decode_tokens == batch and t.num_prefill_tokens == 0 for t in timed)
        for request_id in list(llm.engine.requests):
            llm.engine.abort_request(request_id)
        llm.engine.requests.clear()
    def per_turn(xs):
        return [statistics.median(xs[j:j + block]) for j in range(0, len(xs), block)]

    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    cpu_ms = {name: 1e3 * statistics.median(t) for name, t in cpu.items()}
    report = dict(block=block, ms=ms, cpu_ms=cpu_ms, warmup_s=warm)
    if set(engines) == {"none", "compile"}:
        ratios = [e / c for e, c in zip(per_turn(times["none"]), per_turn(times["compile"]), strict=True)]
        cpu_ratios = [e / c for e, c in zip(per_turn(cpu["none"]), per_turn(cpu["compile"]), strict=True)]
        report.update(eager_ms=ms["none"], compile_ms=ms["compile"], speedup=_summary(ratios),
                      eager_cpu_ms=cpu_ms["none"], compile_cpu_ms=cpu_ms["compile"],
                      cpu_time_speedup=_summary(cpu_ratios))
    return report


def ragged_workload(n: int, seed: int = 0):
    from minirunner import SamplingParams

    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(3, 1000, int(rng.integers(8, 49)))] for _ in range(n)]
    params = [SamplingParams(temperature=0.0, max_tokens=int(rng.integers(8, 65)), ignore_eos=True)
              for _ in range(n)]
    return prompts, params


def ragged(pairs: int, engines: dict, n: int = 64) -> dict:
    """64 ragged requests end to end: seconds per ``generate``, and the per-pair eager/compiled ratio."""
    prompts, params = ragged_workload(n)
    warm, times, outs = {}, {name: [] for name in engines}, {}
    for name, llm in engines.items():  # warm-up: compiles every step the run replays
        t0 = time.perf_counter()
        outs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        warm[name] = time.perf_counter() - t0
    assert outs["none"] == outs["compile"], "compiled and eager tokens differ (greedy)"
    split = {name: {"prefill_s": [], "decode_s": []} for name in engines}  # the trace's step durations
    for i in range(pairs):
        for name in (list(engines) if i % 2 == 0 else list(reversed(engines))):
            since = len(engines[name].get_step_trace())
            t0 = time.perf_counter()
            engines[name].generate(prompts, params, use_tqdm=False)
            times[name].append(time.perf_counter() - t0)
            steps = engines[name].get_step_trace()[since:]
            split[name]["prefill_s"].append(sum(t["duration_s"] for t in steps if t["num_prefill_tokens"]))
            split[name]["decode_s"].append(sum(t["duration_s"] for t in steps if not t["num_prefill_tokens"]))
    ratios = [e / c for e, c in zip(times["none"], times["compile"], strict=True)]
    graphs = engines["compile"].engine.runner.graphs
    return dict(eager_s=statistics.median(times["none"]), compile_s=statistics.median(times["compile"]),
                speedup=_summary(ratios), warmup_s=warm, output_tokens=sum(len(t) for t in outs["none"]),
                steps_median_s={name: {k: statistics.median(v) for k, v in parts.items()}
                                for name, parts in split.items()},
                compiled_steps=[f"{k.name}_c{c}" for k, c in graphs.contexts()])


def child_decode(mode: str, batch: int, steps: int, warmup: int, batches: list[int]) -> None:
    """One process, one engine (configured as in ``decode_steps``: the ladder ``batches``): ``steps``
    decode steps at ``batch`` after the warm-up; prints a JSON line."""
    torch.set_num_threads(1)
    engine = _engine(mode, max_num_seqs=max(batches), cudagraph_capture_sizes=sorted(set(batches)))
    r = decode_steps(batch, steps, warmup, {mode: engine}, block=steps)
    print(json.dumps(dict(ms=r["ms"][mode], cpu_ms=r["cpu_ms"][mode])))


def decode_processes(batches, pairs: int, steps: int, warmup: int) -> dict:
    """Per batch, ``pairs`` pairs of processes in alternating order; the ratio per pair of medians."""
    out = {}
    for b in batches:
        ms: dict[str, list[float]] = {"none": [], "compile": []}
        for i in range(pairs):
            for mode in (("none", "compile") if i % 2 == 0 else ("compile", "none")):
                cmd = [sys.executable, __file__, "--child-decode", mode, str(b), str(steps), str(warmup),
                       "--batches", *map(str, batches)]
                line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
                ms[mode].append(json.loads(line)["ms"])
        ratios = [e / c for e, c in zip(ms["none"], ms["compile"], strict=True)]
        r = out[str(b)] = dict(eager_ms=statistics.median(ms["none"]),
                               compile_ms=statistics.median(ms["compile"]), speedup=_summary(ratios),
                               per_process_ms=ms)
        s = r["speedup"]
        print(f"decode batch {b:3d}, one engine per process: eager {r['eager_ms']:.2f} ms, compiled "
              f"{r['compile_ms']:.2f} ms -> x{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}); "
              f"load {_load()}", flush=True)
    return out


def child_warm_start(freezing: bool) -> None:
    """One process: from LLM(...) to its first compiled decode step; prints a JSON line."""
    torch.set_num_threads(1)
    from torch._dynamo.utils import counters

    from minirunner import SamplingParams
    from minirunner.worker import compile_cache

    compile_cache.COMPILE_OPTIONS.update({"freezing": True} if freezing else {})
    t0 = time.perf_counter()
    llm = _engine("compile", max_num_seqs=8)  # buckets 1, 2, 4, 8: the first step compiles bucket 1
    built = time.perf_counter() - t0
    llm.generate([[5, 6, 7, 8, 9]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
                 use_tqdm=False)
    print(json.dumps(dict(seconds=time.perf_counter() - t0, construction_s=built,
                          inductor={k: v for k, v in counters["inductor"].items() if "cache" in k},
                          aot_autograd={k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
                          steps=[k.name for k in llm.engine.runner.graphs.keys()])))


def warm_start(runs: int, freezing: bool) -> dict:
    """A fresh cache folder: one cold process, then ``runs`` warm ones."""
    folder = tempfile.mkdtemp(prefix="minirunner-compile-")
    env = dict(os.environ, MINIRUNNER_COMPILE_CACHE=folder)
    cmd = [sys.executable, __file__, "--child-warm-start"] + (["--freezing"] if freezing else [])
    results = []
    for _ in range(runs + 1):
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    warm = [r["seconds"] for r in results[1:]]
    return dict(cold=results[0], warm=results[1:], warm_s=_summary(warm),
                cache_files=sum(len(f) for _, _, f in os.walk(folder)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="timed decode steps per engine and batch")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--block", type=int, default=8,
                    help="decode steps per engine per turn (1: the engines alternate every step)")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--ragged-pairs", type=int, default=4, help="alternating pairs of 64 ragged requests")
    ap.add_argument("--ragged-sizes", type=int, nargs="+", default=None,
                    help="the compiled engine's bucket ladder for the 64 ragged requests (default: the "
                         "engine's own, 1, 2, 4, 8, then multiples of 8)")
    ap.add_argument("--warm-runs", type=int, default=2, help="warm processes after the cold one")
    ap.add_argument("--skip", nargs="*", default=[], choices=["decode", "decode_procs", "ragged", "warm"])
    ap.add_argument("--freezing", action="store_true", help="compile with inductor's freezing on")
    ap.add_argument("--decode-pairs", type=int, default=4, help="alternating pairs of decode processes")
    ap.add_argument("--child-warm-start", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-decode", nargs=4, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="benchmarks/results/compile_vs_eager_cpu.json")
    args = ap.parse_args()
    if args.child_warm_start:
        return child_warm_start(args.freezing)
    if args.child_decode:
        mode, batch, steps, warmup = args.child_decode
        return child_decode(mode, int(batch), int(steps), int(warmup), args.batches)
    torch.set_num_threads(1)
    from minirunner.tools.bench import environment
    from minirunner.worker import compile_cache

    if args.freezing:
        compile_cache.COMPILE_OPTIONS.update(freezing=True)
    command = "python benchmarks/compile_vs_eager.py " + " ".join(sys.argv[1:])
    report = dict(environment=environment(), command=command.strip(), load_before=_load(),
                  freezing=args.freezing, note="alternating pairs on a shared machine; ratio = eager / "
                  "compiled per pair, median with min-max and quartiles")
    if "decode" not in args.skip:
        kw = dict(max_num_seqs=max(args.batches), cudagraph_capture_sizes=sorted(set(args.batches)))
        engines = {"none": _engine("none", **kw), "compile": _engine("compile", **kw)}
        report["decode"] = {}
        for b in args.batches:
            r = report["decode"][str(b)] = decode_steps(b, args.steps, args.warmup, engines, args.block)
            s = r["speedup"]
            print(f"decode batch {b:3d}: eager {r['eager_ms']:.2f} ms, compiled {r['compile_ms']:.2f} ms -> "
                  f"x{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}); thread CPU time "
                  f"x{r['cpu_time_speedup']['median']:.2f}; load {_load()}", flush=True)
        del engines
        _write(report, args.out)
    if "decode_procs" not in args.skip:
        report["decode_procs"] = decode_processes(args.batches, args.decode_pairs, args.steps, args.warmup)
        _write(report, args.out)
    if "ragged" not in args.skip:
        kw = dict(max_num_seqs=64, cudagraph_capture_sizes=args.ragged_sizes)
        engines = {"none": _engine("none", **kw), "compile": _engine("compile", **kw)}
        r = report["ragged64"] = ragged(args.ragged_pairs, engines)
        s = r["speedup"]
        print(f"64 ragged: eager {r['eager_s']:.2f} s, compiled {r['compile_s']:.2f} s -> x{s['median']:.2f} "
              f"({s['min']:.2f}-{s['max']:.2f}); steps (median s) {r['steps_median_s']}; warm-up "
              f"{r['warmup_s']}; load {_load()}", flush=True)
        del engines
        _write(report, args.out)
    if "warm" not in args.skip:
        r = report["warm_start"] = warm_start(args.warm_runs, args.freezing)
        print(f"start to first compiled step: cold {r['cold']['seconds']:.1f} s, warm "
              f"{r['warm_s']['median']:.1f} s ({r['warm_s']['min']:.1f}-{r['warm_s']['max']:.1f}); "
              f"warm counters {r['warm'][-1]['inductor']}; load {_load()}", flush=True)
    _write(report, args.out)


def _write(report: dict, path: str) -> None:
    """The report so far (written after each section, so a long run keeps what it measured)."""
    report["load_after"] = _load()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Eager vs ``graph_mode="compile"`` decode step time on the embedded model at batch 1 / 8 / 32, side by
side in one process: the two engines' steps alternate (eager step, compiled step, eager step, ...), so a
noisy shared machine slows both alike. Reports the median engine step (``StepTrace.duration_s``: schedule
+ prepare_inputs + the step + postprocess) per batch, the ratio, and for the compiled engine where a
batch-1 step's time goes (scheduler, prepare_inputs, the compiled replay, postprocess).

    python benchmarks/graphs.py --steps 40 --out benchmarks/results/graphs_cpu.json

Compiling takes tens of seconds per bucket on a small CPU; it happens during the warm-up steps and is
reported separately (``compile_s``), never inside the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from minirunner import LLM, SamplingParams
from minirunner.core.gc_heap import freeze_startup_heap
from minirunner.tools.bench import environment
from minirunner.worker.async_output import AsyncOutput

BATCHES = (1, 8, 32)
PROMPT_LEN = 16


def _timed(obj, name: str, sink: dict, label: str | None = None):
    """Wrap obj.name so each call adds its wall time to sink[label or name] (instrumentation of the real
    method). Returns the method it wrapped."""
    method = getattr(obj, name)
    label = label or name
    sink[label] = []

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = method(*args, **kwargs)
        sink[label].append(time.perf_counter() - t0)
        return out

    setattr(obj, name, wrapper)
    return method


def measure(batch: int, steps: int, warmup: int, engines: dict[str, LLM]) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=warmup + steps + 4, ignore_eos=True)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(PROMPT_LEN)] for i in range(batch)]
    for llm in engines.values():
        llm.clear_step_trace()
        for p in prompts:
            llm.engine.add_request(p, params)
        while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in llm.engine.requests.values()):
            llm.engine.step()
    compile_s = {}
    for name, llm in engines.items():  # warm-up: the compiled engine compiles its bucket here
        t0 = time.perf_counter()
        for _ in range(warmup):
            llm.engine.step()
        compile_s[name] = time.perf_counter() - t0
    for llm in engines.values():
        llm.clear_step_trace()
    for _ in range(steps):
        for llm in engines.values():
            llm.engine.step()
    out = {}
    for name, llm in engines.items():
        trace = list(llm.engine.trace)
        assert all(t.num_decode_tokens == batch and t.num_prefill_tokens == 0 for t in trace)
        graph = {t.graph for t in trace}
        durations = [t.duration_s for t in trace]
        out[name] = dict(median_step_ms=1e3 * statistics.median(durations),
                         min_step_ms=1e3 * min(durations), graph=sorted(graph),
                         bucket_size=trace[0].bucket_size, warmup_s=compile_s[name])
    for llm in engines.values():
        for request_id in list(llm.engine.requests):
            llm.engine.abort_request(request_id)
        llm.engine.requests.clear()
    out["compile_speedup"] = out["none"]["median_step_ms"] / out["compile"]["median_step_ms"]
    return out


def stage_profile(llm: LLM, steps: int) -> dict:
    """Where a compiled batch-1 decode step's time goes: medians (ms) of each stage over ``steps``."""
    engine, runner = llm.engine, llm.engine.runner
    sink: dict[str, list[float]] = {}
    _timed(engine.scheduler, "schedule", sink)
    _timed(runner, "prepare_inputs", sink)
    _timed(runner.graphs, "run", sink)
    # the step's read: its sampled tokens to the host (AsyncOutput.get_output, a class attribute)
    read = _timed(AsyncOutput, "get_output", sink, "postprocess")
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    engine.add_request(list(range(3, 3 + PROMPT_LEN)), params)
    for _ in range(4):  # prefill, then warm decode steps
        engine.step()
    for v in sink.values():
        v.clear()
    llm.clear_step_trace()
    for _ in range(steps):
        engine.step()
    total = statistics.median(t.duration_s for t in engine.trace)
    stages = {k: 1e3 * statistics.median(v) for k, v in sink.items()}
    stages["engine_step_total"] = 1e3 * total
    stages["bucket_size"] = engine.trace[-1].bucket_size
    stages["other_engine_work"] = stages["engine_step_total"] - sum(  # medians: an estimate
        stages[k] for k in ("schedule", "prepare_inputs", "run", "postprocess"))
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    engine.requests.clear()
    AsyncOutput.get_output = read
    return stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="timed decode steps per engine and batch")
    ap.add_argument("--warmup", type=int, default=3, help="untimed decode steps first (compiles)")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the block tables' full width (default: the model's 256); a graph step attends "
                         "over all of it with the torch backend")
    ap.add_argument("--out", default="benchmarks/results/graphs_cpu.json")
    args = ap.parse_args()
    ladder = sorted(set(args.batches))
    kw = dict(device="cpu", max_num_seqs=max(ladder), cudagraph_capture_sizes=ladder,
              max_model_len=args.max_model_len)
    freeze_startup_heap()  # a whole-process job, as the CLI's entry points
    engines = {"none": LLM(graph_mode="none", **kw), "compile": LLM(graph_mode="compile", **kw)}
    command = f"python benchmarks/graphs.py --steps {args.steps} --batches {' '.join(map(str, args.batches))}"
    if args.max_model_len:
        command += f" --max-model-len {args.max_model_len}"
    report = dict(environment=environment(), command=command, max_model_len=args.max_model_len,
                  note="medians of interleaved steps on a shared, noisy machine; ratios are the figure",
                  batches={})
    for b in args.batches:
        r = report["batches"][str(b)] = measure(b, args.steps, args.warmup, engines)
        print(f"batch {b:3d}: eager {r['none']['median_step_ms']:.3f} ms, compile "
              f"{r['compile']['median_step_ms']:.3f} ms (bucket {r['compile']['bucket_size']}) -> "
              f"x{r['compile_speedup']:.2f}; compile warm-up {r['compile']['warmup_s']:.1f} s", flush=True)
    report["compile_batch1_stages_ms"] = stage_profile(engines["compile"], args.steps)
    print("compiled batch-1 step, median ms per stage:",
          {k: round(v, 3) for k, v in report["compile_batch1_stages_ms"].items()})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

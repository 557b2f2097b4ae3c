"""``LLM(tensor_parallel_size=2)`` against one device through the whole engine, on this machine's CPU (gloo):
the embedded default model, side by side in one process, alternating, repeated; then where N = 2's time
goes (the collectives and the step's pipe messages, timed on their own at the step's shapes, and the
collectives as they ran inside the steps of one profiled run).

    python benchmarks/tp_engine.py --out benchmarks/results/tp_engine_cpu.json

Rows: N = 1 with 2 torch threads (the whole 2-core machine), N = 1 with 1 thread, N = 2 with 1 thread per
rank (two processes on the same two cores). Each repeat runs every row once on the same greedy workload
(``--seqs`` prompts of ``--prompt-len`` random tokens, ``--max-tokens`` each), in a rotating order;
reported: medians over ``--repeats`` and [min, max], of the wall time, output tokens/s, and the median
prefill and decode step of each run (from the step trace). The greedy tokens of every row are compared.

Where the time goes: per step N = 2 runs 2 x layers + 1 all-reduces of [tokens, hidden] (o and down
projections, the vocab-parallel embedding), one all-gather of [sampled rows, vocab / 2] (lm_head), and two
pipe messages to the worker with their replies (the step's host arrays, then the logits rows). Those
are timed alone in the same two processes (1 thread each), medians of many, and multiplied out; and
one more N = 2 run under torch.profiler gives the collectives' time inside the steps, waits included
(a rank that arrives first waits for the other there).
Timings on a machine busy with other jobs are noisy: the load average is recorded with them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from tp_step import emit, machine  # benchmarks/ is on the path when a script here runs

from minirunner import LLM, SamplingParams
from minirunner.assets import default_model_dir
from minirunner.config import ModelConfig
from minirunner.distributed import TPContext, WorkerGroup


class Collectives:
    """Built on both ranks: times the collectives of one step at its shapes (rank 0's clock)."""

    def __init__(self, tp: TPContext):
        self.tp = tp
        torch.set_num_threads(1)

    def noop(self) -> None:
        """Nothing: ``group.call("noop")`` is one pipe message and its reply."""

    def time_all_reduce(self, rows: int, hidden: int, iters: int) -> float:
        x = torch.randn(rows, hidden)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            self.tp.all_reduce(x)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    def time_all_gather(self, rows: int, cols: int, iters: int) -> float:
        x = torch.randn(rows, cols)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            self.tp.all_gather_last(x)
            times.append(time.perf_counter() - t)
        return statistics.median(times)


def spread(values: list[float], digits: int = 2) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def run_once(llm: LLM, threads: int, prompts, params) -> dict:
    torch.set_num_threads(threads)  # process-wide: each row sets its own before it runs
    llm.clear_step_trace()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    trace = llm.get_step_trace()
    prefill = [s["duration_s"] for s in trace if s["num_prefill_tokens"]]
    decode = [s["duration_s"] for s in trace if not s["num_prefill_tokens"] and s["num_tokens"]]
    tokens = [o.outputs[0].token_ids for o in outs]
    return {"wall_s": wall, "output_tok_per_s": sum(map(len, tokens)) / wall, "steps": len(trace),
            "prefill_step_ms": 1e3 * statistics.median(prefill),
            "decode_step_ms": 1e3 * statistics.median(decode), "tokens": tokens}


def in_step_collectives(llm: LLM, prompts, params) -> dict:
    """One N = 2 run under torch.profiler: rank 0's gloo collectives as they ran inside the steps (from
    launch to completion: the transfer plus any wait for the other rank to arrive)."""
    torch.set_num_threads(1)
    llm.clear_step_trace()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
    trace = llm.get_step_trace()
    step_ms = 1e3 * sum(s["duration_s"] for s in trace)
    ops = {e.key: e for e in prof.key_averages() if e.key.startswith("gloo:")}
    total_ms = sum(e.cpu_time_total for e in ops.values()) / 1e3
    return {"steps": len(trace), "all_steps_ms": round(step_ms, 1),
            "ops": {k: {"calls": e.count, "mean_ms": round(e.cpu_time_total / e.count / 1e3, 3)}
                    for k, e in ops.items()},
            "collectives_ms": round(total_ms, 1), "share_of_step_time": round(total_ms / step_ms, 3)}


def where_time_goes(mc: ModelConfig, seqs: int, prompt_len: int, iters: int) -> dict:
    """Rank 0's median time of each collective and pipe round trip of one N = 2 step, alone."""
    with WorkerGroup(2, "cpu", Collectives) as group:
        group.call("noop")
        t = []
        for _ in range(iters):
            s = time.perf_counter()
            group.call("noop")
            t.append(time.perf_counter() - s)
        pipe = statistics.median(t)
        out = {"pipe_round_trip_ms": round(1e3 * pipe, 3)}
        vocab_shard = -(-mc.vocab_size // 2)
        for name, rows in (("decode", seqs), ("prefill", seqs * prompt_len)):
            ar = group.call("time_all_reduce", rows, mc.hidden_size, iters)
            ag = group.call("time_all_gather", seqs, vocab_shard, iters)
            n_ar = 2 * mc.num_layers + 1
            total = n_ar * ar + ag + 2 * pipe
            out[name] = {"all_reduce_ms": round(1e3 * ar, 3), "all_reduces_per_step": n_ar,
                         "all_gather_ms": round(1e3 * ag, 3), "pipe_messages_per_step": 2,
                         "communication_per_step_ms": round(1e3 * total, 3),
                         "shape": [rows, mc.hidden_size]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=300, help="timings of each collective alone")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mc = ModelConfig.from_dir(default_model_dir())
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(3, mc.vocab_size, args.prompt_len).tolist()}
               for _ in range(args.seqs)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    engines = {"N=1, 2 threads": (LLM(num_threads=2), 2), "N=1, 1 thread": (LLM(num_threads=1), 1),
               "N=2, 1 thread per rank": (LLM(tensor_parallel_size=2, num_threads=1), 1)}
    for llm, threads in engines.values():  # warm-up (first-time allocations)
        run_once(llm, threads, prompts[:2], params)
    runs = {name: [] for name in engines}
    names = list(engines)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
            runs[name].append(run_once(*engines[name], prompts, params))
    tokens = [run["tokens"] for rows in runs.values() for run in rows]
    rows = {name: {key: spread([run[key] for run in rs], 3 if key == "wall_s" else 2)
                   for key in ("wall_s", "output_tok_per_s", "prefill_step_ms", "decode_step_ms")}
            for name, rs in runs.items()}
    in_step = in_step_collectives(engines["N=2, 1 thread per rank"][0], prompts, params)
    for llm, _ in engines.values():
        llm.close()
    comm = {"alone": where_time_goes(mc, args.seqs, args.prompt_len, args.iters), "in_steps": in_step}
    tp = rows["N=2, 1 thread per rank"]
    for phase in ("decode", "prefill"):
        step = tp[f"{phase}_step_ms"]["median"]
        alone = comm["alone"][phase]
        alone["share_of_n2_step"] = round(alone["communication_per_step_ms"] / step, 3)
    report = {"cpu": rows, "where_n2_time_goes": comm, "gpu (NCCL, N = 1 and 2)": "not measured",
              "greedy_tokens_identical": all(t == tokens[0] for t in tokens),
              "workload": {"seqs": args.seqs, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
                           "repeats": args.repeats},
              "model": {"name": "embedded default (LLM() with no model)", "hidden_size": mc.hidden_size,
                        "layers": mc.num_layers, "vocab_size": mc.vocab_size},
              "machine": machine()}
    emit(report, args.out)


if __name__ == "__main__":
    main()

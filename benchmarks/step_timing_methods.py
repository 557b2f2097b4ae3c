"""Do notebook 04's two measurements of the batch-1 eager step disagree because of the method?

Notebook 04 times the step twice: section 1 with ``measure_decode_steps`` (steps back to back) and section 6
with ``calibrate_eager`` (each round first replays every recorded operator of the real step and of its
overhead twin, then times two steps). Both use ``time.thread_time``. This script runs, in turn and
repeated, steps back to back, steps after recording (arguments kept alive), steps each preceded by a
replay pass of both recorded steps, ``measure_decode_steps`` and ``calibrate_eager``, and writes the median
step of each (ms, this thread's CPU time) per repeat.

    python benchmarks/step_timing_methods.py --repeats 3 --out benchmarks/results/step_timing_methods_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from minirunner import LLM
from minirunner.assets import default_model_dir
from minirunner.tools.profiling import engine_of, finish_decode, record_step, replay_pass, start_decode
from minirunner.tools.step_timing import calibrate_eager, measure_decode_steps, write_overhead_twin

CLOCK = time.thread_time


def steps(llm, twin, replay_before: bool, record: bool, n: int = 20) -> float:
    """Median ms of n batch-1 decode steps of ``llm`` (the twin steps in between, as in the notebook)."""
    e, t = engine_of(llm), engine_of(twin)
    out = []
    try:
        for x in (e, t):
            start_decode(x, 1, 16, 2 * n + 8)
        recs = [record_step(x, 1, keep_args=True) for x in (e, t)] if record else []
        for _ in range(n):
            if replay_before:
                for c in recs:
                    replay_pass(c, None)
            t0 = CLOCK()
            e.step()
            out.append(CLOCK() - t0)
            t.step()
    finally:
        for x in (e, t):
            finish_decode(x)
    return statistics.median(out) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    kw = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=32, num_threads=1)
    llm = LLM(**kw)
    twin = LLM(model=str(write_overhead_twin(default_model_dir())), **kw)
    methods = {
        "steps back to back": lambda: steps(llm, twin, False, False),
        "steps after recording (arguments kept)": lambda: steps(llm, twin, False, True),
        "each step after a replay pass": lambda: steps(llm, twin, True, True),
        "measure_decode_steps (section 1)": lambda: measure_decode_steps(
            [llm, twin], (1,), 12, clock=CLOCK)[0][1] * 1e3,
        "calibrate_eager (section 6)": lambda: calibrate_eager(
            llm, twin, 1, rounds=10, statistic=statistics.median).measured_step * 1e3,
    }
    result: dict = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():  # in turn, so every method sees the same load
            result[name].append(round(fn(), 3))
    for name, xs in result.items():
        print(f"{name:40s} median step ms per repeat: {xs}")
    doc = {"what": "batch-1 eager decode step of the embedded model, median ms of this thread's CPU time",
           "command": f"python benchmarks/step_timing_methods.py --repeats {args.repeats}",
           "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), shared CPU",
           "torch": torch.__version__, "ms_per_repeat": result}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()

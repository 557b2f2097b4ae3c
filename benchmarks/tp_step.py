"""One model step with tensor parallelism N = 1 against N = 2 on this machine's CPU (gloo), side by side:
the embedded model's forward over a paged batch, no engine around it (phase 1 of tensor parallelism;
the engine-level comparison comes with ``LLM(tensor_parallel_size=N)``).

    python benchmarks/tp_step.py --out benchmarks/results/tp_step_cpu.json

N = 1 is today's unsharded model, run with 1 and with 2 torch threads (2: the whole 2-core machine);
N = 2 runs one thread per rank (two processes, the same two cores), so each rank does half the matmul work
and every layer adds two all-reduces over localhost TCP. A prefill step (``--seqs`` prompts of
``--prompt-len`` tokens) and decode steps of the same batch; medians of ``--repeats``. The greedy tokens
of both runs are compared too. Timings on a machine busy with other jobs are noisy: the load average is
recorded with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from minirunner.assets import default_model_dir
from minirunner.distributed import TPContext, WorkerGroup
from minirunner.distributed.shard_worker import ShardWorker, StepBatch
from minirunner.tools.bench import environment

BLOCK = 16


def batch(seqs: int, start: int, n: int, tokens: np.ndarray, blocks_per_seq: int) -> StepBatch:
    """``seqs`` sequences, each its own run of blocks, every one computing positions [start, start + n)."""
    pos = np.tile(np.arange(start, start + n), seqs)
    table = np.arange(seqs * blocks_per_seq, dtype=np.int32).reshape(seqs, blocks_per_seq)
    slots = table[np.repeat(np.arange(seqs), n), pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK
    qsl = np.arange(seqs + 1, dtype=np.int32) * n
    return StepBatch(tokens.reshape(-1).astype(np.int64), pos, slots, qsl,
                     np.full(seqs, start + n, dtype=np.int32), table, qsl[1:].astype(np.int64) - 1)


def run(execute, args, vocab: int) -> dict:
    rng = np.random.default_rng(0)
    per_seq = -(-(args.prompt_len + args.decode_steps * args.repeats + 1) // BLOCK)
    prompts = rng.integers(3, vocab, (args.seqs, args.prompt_len))
    prefill = []
    for _ in range(args.repeats):  # the same prompt over the same blocks each time: a fresh prefill
        t = time.perf_counter()
        logits = execute(batch(args.seqs, 0, args.prompt_len, prompts, per_seq))
        prefill.append(time.perf_counter() - t)
    tokens, decode, pos = [logits.argmax(-1).numpy()], [], args.prompt_len
    for _ in range(args.decode_steps * args.repeats):
        t = time.perf_counter()
        logits = execute(batch(args.seqs, pos, 1, tokens[-1], per_seq))
        decode.append(time.perf_counter() - t)
        tokens.append(logits.argmax(-1).numpy())
        pos += 1
    return {"prefill_step_ms": round(1e3 * statistics.median(prefill), 2),
            "decode_step_ms": round(1e3 * statistics.median(decode), 2),
            "tokens": np.stack(tokens, 1).tolist()}


def machine() -> dict:
    """The machine a figure was measured on, its load when measured included."""
    return {**environment(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}


def emit(report: dict, out: str | None) -> None:
    """Print the report, and write it to ``out`` as JSON when given."""
    print(json.dumps(report, indent=1))
    if out:
        Path(out).write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=8, help="decode steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = str(default_model_dir())
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    blocks = args.seqs * -(-(args.prompt_len + args.decode_steps * args.repeats + 1) // BLOCK)
    common = (model, "float32", blocks, BLOCK, "torch", "cpu")
    rows = {}
    for threads in (1, 2):
        one = ShardWorker(TPContext(), *common, threads)
        rows[f"N=1, {threads} thread(s)"] = run(one.execute, args, vocab)
        del one
    with WorkerGroup(2, "cpu", ShardWorker, (*common, 1)) as group:
        rows["N=2"] = run(lambda b: group.call("execute", b), args, vocab)
    tokens = [row.pop("tokens") for row in rows.values()]
    same = all(t == tokens[0] for t in tokens)
    report = {"cpu": {**rows, "N=2": {"threads_per_rank": 1, **rows["N=2"]}},
              "gpu": "not measured", "greedy_tokens_identical": same,
              "batch": {"seqs": args.seqs, "prompt_len": args.prompt_len},
              "machine": machine()}
    emit(report, args.out)


if __name__ == "__main__":
    main()

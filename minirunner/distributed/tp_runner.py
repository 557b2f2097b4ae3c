"""The engine's runner under tensor parallelism: rank 0's ModelRunner, with the workers in lockstep.

Owns what ``LLM(tensor_parallel_size=N)`` adds to a step, and checking the engine options it supports.
The driver process is rank 0: a plain :class:`ModelRunner` over its shard model prepares the step's
inputs from its own InputBatch, holds the rank-0 KV cache and samples, alone (seeded sampling, logits
processors and logprobs are the one-device code). Each collective-bearing stage first posts the same
stage to the N - 1 workers (``WorkerGroup.post``): ``forward`` with the step's host arrays
(:class:`StepBatch`), then ``logits`` with the rows whose logits the driver computes (the sampled rows,
a prompt-logprobs request's rows), so every rank runs the same collectives in the same order; the step
ends by collecting one small reply per command (``WorkerGroup.run_posted``), which is where a worker's
error surfaces. The step's block copies (``copy_blocks``) run on every rank first; per-request state
lives on the driver only.
"""

from __future__ import annotations

import torch

from minirunner.distributed.shard_worker import StepBatch
from minirunner.distributed.workers import WorkerGroup
from minirunner.worker.model_runner import ModelRunner


class TPModelRunner(ModelRunner):
    """A ModelRunner over rank 0's shard (``group.local``) whose steps the workers of ``group`` join."""

    def __init__(self, group: WorkerGroup, *args, **kwargs):
        super().__init__(group.local, *args, **kwargs)
        self.group = group

    def enable_graphs(self, *args, **kwargs):
        raise ValueError("graph_mode 'compile' and 'cuda' are not supported with tensor_parallel_size > 1 "
                         "(the workers run eager steps); pass graph_mode='none'")

    def execute(self, scheduler_output, prev=None):
        step = super().execute
        return self.group.run_posted(lambda: step(scheduler_output, prev))

    def run_model(self, inputs):
        self.group.post("forward", StepBatch.of_inputs(inputs))
        return super().run_model(inputs)

    def logits_at(self, hidden: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        self.group.post("logits", None if rows is None else rows.cpu().numpy())
        return super().logits_at(hidden, rows)

    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Inside ``execute`` (the step's block copies): every rank copies its own shard's blocks."""
        if src:
            self.group.post("copy_blocks", src, dst)
            super().copy_blocks(src, dst)

    def close(self) -> None:
        """Stop the workers (also at exit, and when the group is garbage-collected)."""
        self.group.close()

    def worker_pids(self) -> list[int]:
        """The worker processes' ids (rank 1 first)."""
        return self.group.pids()


def check_tensor_parallel(config, model_config) -> None:
    """ValueError for an engine option that ``tensor_parallel_size > 1`` does not support, naming it, or a
    model whose heads do not split (model/tensor_parallel.py's head policy). ``config.graph_mode`` is
    resolved already ("auto" is "none" under tensor parallelism)."""
    from minirunner.model.tensor_parallel import plan_shards

    n = config.tensor_parallel_size
    plan_shards(model_config, 0, n)  # raises ValueError naming tensor_parallel_size
    if config.device.type == "cuda":
        if n > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size={n} needs {n} GPUs (one per rank) but "
                             f"{torch.cuda.device_count()} are visible; pass a smaller size")
        if config.num_kv_blocks is None and config.kv_cache_memory_bytes is None:
            raise ValueError("tensor_parallel_size > 1 on CUDA sizes each rank's KV cache from "
                             "kv_cache_memory_bytes or num_kv_blocks (no profiling step runs across "
                             "ranks): pass one of them")
    refused = {"speculative_config": (config.speculative_config is not None, "None"),
               "async_scheduling": (config.async_scheduling, "False"),
               "graph_mode": (config.graph_mode != "none", "'none'")}
    for name, (bad, fix) in refused.items():
        if bad:
            raise ValueError(f"{name}={getattr(config, name)!r} is not supported with "
                             f"tensor_parallel_size={n} (the workers run eager, non-speculative steps); "
                             f"pass {name}={fix} or tensor_parallel_size=1")

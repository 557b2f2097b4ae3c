"""Sizing the KV cache on CUDA from a profiling forward, as vLLM does.

Owns one dummy step at the largest batch the engine will ever schedule (``max_num_batched_tokens``
tokens over up to ``max_num_seqs`` sequences, through the real runner, backend and sampler) and the
arithmetic ``KV bytes = total x gpu_memory_utilization - peak - memory used outside PyTorch``. It never
keeps anything it allocated. Written for CUDA and not run on a GPU in this repository's CI; the step it
runs is exercised on CPU by the tests.
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.attention import make_backend
from minirunner.config import EngineConfig, ModelConfig
from minirunner.core.sched.output import NewRequestData, SchedulerOutput
from minirunner.kv.block_table import cdiv
from minirunner.sampling_params import SamplingParams


def kv_budget_from_profile(total: int, utilization: float, peak: int, non_torch: int) -> int:
    """Bytes left for the KV cache: the share of the GPU we may use, minus the profiled peak of
    PyTorch allocations (weights + activations of the largest step) and memory others hold."""
    return int(total * utilization) - peak - non_torch


def run_profiling_step(model, config: EngineConfig,
                       model_config: ModelConfig) -> tuple[list[int], int]:
    """Run one step of the largest batch through a throwaway runner and KV cache; returns the
    sampled tokens (one per sequence) and the bytes of that throwaway KV cache."""
    from minirunner.worker.model_runner import ModelRunner  # runner imports this module's callers

    mc, block = model_config, config.block_size
    tokens = min(config.max_num_batched_tokens, config.max_num_seqs * config.max_model_len)
    num_seqs = max(1, min(config.max_num_seqs, tokens))
    per_seq = cdiv(tokens, num_seqs)
    lens = [per_seq] * (tokens // per_seq) + ([tokens % per_seq] if tokens % per_seq else [])
    num_blocks = sum(cdiv(n, block) for n in lens)
    backend = make_backend(config, mc)
    runner = ModelRunner(model, backend, num_blocks, block, len(lens), tokens, config.max_model_len)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=1, seed=0)
    sched, first = SchedulerOutput(), 0
    for i, n in enumerate(lens):  # each sequence its own consecutive blocks
        rid, blocks = f"profile-{i}", cdiv(n, block)
        sched.scheduled_new_reqs.append(NewRequestData(rid, [0] * n, params, i,
                                                       list(range(first, first + blocks)), 0))
        sched.num_scheduled_tokens[rid] = n
        sched.new_token_ids[rid] = np.zeros(n, dtype=np.int64)
        sched.sampling_req_ids.add(rid)
        first += blocks
    try:
        out = runner.execute(sched).get_output()
        sampled = [run[0] for run in out.runs]  # one token each: no speculative drafts here
    finally:
        del runner
    return sampled, (num_blocks + 1) * block * mc.kv_bytes_per_token(config.dtype)  # + the null block


def profile_kv_budget(model, config: EngineConfig, model_config: ModelConfig) -> int:
    """KV bytes on CUDA: total x utilisation - peak of the profiling step (its own throwaway KV
    excluded) - memory held outside PyTorch (the CUDA context, other processes)."""
    dev = config.device
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    free, total = torch.cuda.mem_get_info(dev)
    non_torch = total - free - torch.cuda.memory_reserved(dev)
    _, throwaway_kv = run_profiling_step(model, config, model_config)
    torch.cuda.synchronize(dev)
    peak = max(0, torch.cuda.max_memory_allocated(dev) - throwaway_kv)
    torch.cuda.empty_cache()
    return kv_budget_from_profile(total, config.gpu_memory_utilization, peak, max(0, non_torch))

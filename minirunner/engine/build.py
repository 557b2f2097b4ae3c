"""Building an engine's parts once: the model (or, under tensor parallelism, the worker processes and rank
0's shard), the KV budget, the attention backend, the KV manager, the scheduler, the model runner (graphs
enabled), the proposer the runner drafts with and the speculator.

Owns the construction order and the sizing rules (how many KV blocks a budget buys, with a draft
model's cache paid from the same budget: its KV layers hold as many blocks as the target's, indexed by
the same block ids; the prefix-cache salt). It never runs a step.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from minirunner.attention import AttentionBackend, make_backend, resolve_backend_name
from minirunner.config import EngineConfig, ModelConfig
from minirunner.distributed.shard_worker import build_rank
from minirunner.distributed.tp_runner import TPModelRunner
from minirunner.distributed.workers import WorkerGroup
from minirunner.engine.scheduler import Scheduler
from minirunner.kv.block_table import cdiv
from minirunner.kv.contiguous import ContiguousKVManager
from minirunner.kv.manager import KVCacheManager
from minirunner.model import batch_invariant
from minirunner.model.decoder import DecoderLM
from minirunner.model.loader import load_model
from minirunner.model.tensor_parallel import local_config, plan_shards
from minirunner.spec_decode.config import SpeculativeConfig
from minirunner.spec_decode.draft_model import DraftModel
from minirunner.spec_decode.ngram import NgramProposer
from minirunner.spec_decode.speculator import Speculator
from minirunner.worker.memory_profile import profile_kv_budget
from minirunner.worker.model_runner import ModelRunner

_DEFAULT_CPU_KV_BYTES = 1 << 30
logger = logging.getLogger(__name__)


@dataclass(eq=False)
class EngineParts:
    """Everything ``build_engine`` made, for LLMEngine to hold."""

    model: DecoderLM
    spec_config: SpeculativeConfig | None
    num_kv_blocks: int
    backend: AttentionBackend
    kv: KVCacheManager | ContiguousKVManager
    scheduler: Scheduler
    runner: ModelRunner
    spec: Speculator | None
    num_threads: int


def build_engine(config: EngineConfig, mc: ModelConfig) -> EngineParts:
    """Load the model and build the engine's parts, in order (the KV budget needs the model on CUDA)."""
    num_threads = torch.get_num_threads()  # the engine's own: LLMEngine builds inside its scope
    tp = config.tensor_parallel_size
    model = load_model(config.model, mc, config.dtype, config.device) if tp == 1 else None
    spec_config = None if config.speculative_config is None else SpeculativeConfig.from_dict(
        config.speculative_config, config.model, mc, config.max_model_len)
    # A draft model's cache has as many blocks as the target's: one memory budget pays for both.
    draft_bytes = 0 if spec_config is None or spec_config.model is None \
        else ModelConfig.from_dir(spec_config.model).kv_bytes_per_token(config.dtype)
    # Under tensor parallelism every rank's cache holds num_blocks blocks of its own KV heads.
    num_blocks = kv_budget_blocks(config, mc if tp == 1 else local_config(mc, plan_shards(mc, 0, tp)),
                                  model, draft_bytes)
    group = None if tp == 1 else WorkerGroup(tp, config.device, build_rank, (
        config.model, config.dtype, num_blocks, config.block_size,
        resolve_backend_name(config.attention_backend, config.device), config.device, num_threads,
        config.batch_invariant))
    if group is not None:
        model = group.local  # rank 0's shard
    if config.batch_invariant:
        batch_invariant.apply(model)
        logger.info(batch_invariant.describe())
    backend = make_backend(config, model.config)
    if config.kv_layout == "paged":
        kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching,
                            cache_salt(config, mc))
    else:
        kv = ContiguousKVManager(num_blocks, config.block_size, config.max_model_len,
                                 exact=config.kv_layout == "contiguous_exact")
    sizes = (num_blocks, config.block_size, config.max_num_seqs, config.max_num_batched_tokens,
             config.max_model_len)
    runner = ModelRunner(model, backend, *sizes) if group is None else TPModelRunner(group, backend, *sizes)
    if config.graph_mode != "none":
        from minirunner.worker.cudagraph import capture_sizes

        runner.enable_graphs(config.graph_mode,
                             capture_sizes(config.max_num_seqs, config.cudagraph_capture_sizes),
                             0 if spec_config is None else spec_config.max_num_speculative_tokens,
                             draft_q=spec_config is not None and spec_config.method == "draft_model")
    spec = None if spec_config is None else Speculator(spec_config)
    if spec_config is not None:  # the runner proposes after sampling
        runner.set_proposer(DraftModel(spec_config.model, config, num_blocks,
                                       spec_config.max_num_speculative_tokens)
                            if spec_config.method == "draft_model"
                            else NgramProposer(spec_config.prompt_lookup_min, spec_config.prompt_lookup_max))
    # a draft model writes its drafts' K/V past the step: the scheduler sets their slots aside
    lookahead = spec_config is not None and spec_config.method == "draft_model"
    return EngineParts(model, spec_config, num_blocks, backend, kv,
                       Scheduler(kv, config.max_num_seqs, config.max_num_batched_tokens,
                                 config.scheduling_policy, draft_lookahead=lookahead), runner, spec,
                       num_threads)


def kv_budget_blocks(cfg: EngineConfig, mc: ModelConfig, model: DecoderLM, draft_bytes_per_token: int) -> int:
    """How many KV blocks the pool hands out: ``num_kv_blocks`` if given, else what the byte budget
    (``kv_cache_memory_bytes``; on CUDA the profiled free memory; on a CPU a default) buys, target and
    draft caches together, minus the null block."""
    block_bytes = (mc.kv_bytes_per_token(cfg.dtype) + draft_bytes_per_token) * cfg.block_size
    if cfg.num_kv_blocks is not None:
        return cfg.num_kv_blocks
    if cfg.kv_cache_memory_bytes is not None:
        budget, source = cfg.kv_cache_memory_bytes, "kv_cache_memory_bytes"
    elif cfg.device.type == "cuda":
        # vLLM's rule: total x utilisation - the peak of a profiling forward at the largest batch.
        budget = profile_kv_budget(model, cfg, mc)
        source = (f"gpu_memory_utilization={cfg.gpu_memory_utilization} of total GPU memory "
                  "minus the profiled peak")
    else:
        # max_num_seqs full-length requests, plus the null block (paid for below)
        per_seq = cdiv(cfg.max_model_len, cfg.block_size) * block_bytes
        budget = min(_DEFAULT_CPU_KV_BYTES, per_seq * cfg.max_num_seqs + block_bytes)
        source = "the default CPU budget"
    # The KV tensors hold one more block than the pool hands out (the runner's null block, where
    # padding rows write), so the budget pays for it too.
    blocks = budget // block_bytes - 1
    if blocks < 1:
        raise ValueError(f"the KV cache does not fit: {source} gives {budget} bytes but two blocks "
                         f"of {cfg.block_size} tokens (one, plus the null block) need "
                         f"{2 * block_bytes} bytes for this model; raise the budget, or lower "
                         "block_size")
    return int(blocks)


def cache_salt(config: EngineConfig, model_config: ModelConfig) -> bytes:
    """What makes K/V of equal tokens differ between engines: the model and the KV dtype."""
    text = f"{Path(config.model).resolve()}|{model_config}|{config.dtype}"
    return hashlib.sha256(text.encode()).digest()

"""LLMEngine: the loop — admit requests, schedule a step, run it, append tokens, finish, report.

Owns request validation at admission, the per-step trace, stop conditions (EOS, max_tokens,
max_model_len, stop strings) and detokenisation. A request refused at admission raises ValueError and
leaves every other request untouched.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from minirunner.attention import get_backend_class, resolve_backend_name
from minirunner.config import EngineConfig, ModelConfig
from minirunner.kv.manager import KVCacheManager
from minirunner.model.loader import load_model
from minirunner.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minirunner.request import Request, RequestStatus
from minirunner.runner import ModelRunner
from minirunner.sampling_params import SamplingParams
from minirunner.scheduler import Scheduler
from minirunner.spec.config import SpeculativeConfig
from minirunner.spec.speculator import Speculator
from minirunner.tokenizer import load_tokenizer

_DEFAULT_CPU_KV_BYTES = 1 << 30
TRACE_MAX_STEPS = 10_000


@dataclass
class StepTrace:
    """What one engine step did, as plain data for notebooks and plots."""

    step: int
    request_ids: list[str]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_tokens: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    num_preempted: int
    preempted_ids: list[str]
    finished_ids: list[str]
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    duration_s: float = 0.0
    # speculative decoding: {request_id: [drafts verified, drafts accepted]}; rolled-back KV slots of a
    # request = drafts - accepted
    spec_runs: dict[str, list[int]] = field(default_factory=dict)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    propose_s: float = 0.0
    verify_s: float = 0.0


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig | None = None):
        self.config = config
        self.model_config = model_config or ModelConfig.from_dir(config.model)
        config.validate(self.model_config)
        self.tokenizer = load_tokenizer(config.model)
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_ids = (frozenset(self.model_config.eos_token_ids)
                              | _generation_eos(config.model)
                              | frozenset(() if tokenizer_eos is None else (tokenizer_eos,)))
        torch.manual_seed(config.seed)
        self._rng = random.Random(config.seed)
        mc = self.model_config
        self.model = load_model(config.model, mc, config.dtype, config.device)
        spec_config = None
        if config.speculative_config is not None:
            spec_config = SpeculativeConfig.from_dict(config.speculative_config, config.model, mc,
                                                      config.max_model_len)
        # A draft model's cache has as many blocks as the target's: one memory budget pays for both.
        self._draft_kv_bytes_per_token = 0 if spec_config is None or spec_config.model is None \
            else ModelConfig.from_dir(spec_config.model).kv_bytes_per_token(config.dtype)
        self.num_kv_blocks = self._kv_budget_blocks()
        backend_name = resolve_backend_name(config.attention_backend, config.device)
        self.backend = get_backend_class(backend_name)(
            mc.num_q_heads, mc.num_kv_heads, mc.head_dim, mc.head_dim ** -0.5,
            config.block_size, config.device, config.dtype)
        self.kv = KVCacheManager(self.num_kv_blocks, config.block_size,
                                 config.enable_prefix_caching)
        self.block_pool = self.kv.pool
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, self.backend, self.num_kv_blocks, config.block_size,
                                  config.max_num_seqs, config.max_num_batched_tokens,
                                  config.max_model_len)
        self.spec = None if spec_config is None else Speculator(spec_config, config,
                                                                self.num_kv_blocks)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        # The most recent steps only, so a long-lived engine does not grow without bound.
        self.trace: deque[StepTrace] = deque(maxlen=TRACE_MAX_STEPS)
        self.keep_logits = False
        self.last_logits: dict[str, torch.Tensor] = {}
        self._steps = 0

    # -- KV budget ------------------------------------------------------------------------------
    def _kv_budget_blocks(self) -> int:
        cfg, mc = self.config, self.model_config
        block_bytes = (mc.kv_bytes_per_token(cfg.dtype) + self._draft_kv_bytes_per_token) \
            * cfg.block_size
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        if cfg.kv_cache_memory_bytes is not None:
            budget, source = cfg.kv_cache_memory_bytes, "kv_cache_memory_bytes"
        elif cfg.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(cfg.device)
            budget = int(free * cfg.gpu_memory_utilization)
            source = f"gpu_memory_utilization={cfg.gpu_memory_utilization} of free GPU memory"
        else:
            per_seq = -(-cfg.max_model_len // cfg.block_size) * block_bytes
            budget = min(_DEFAULT_CPU_KV_BYTES, per_seq * cfg.max_num_seqs)
            source = "the default CPU budget"
        blocks = budget // block_bytes
        if blocks < 1:
            raise ValueError(f"the KV cache does not fit: {source} gives {budget} bytes but one block "
                             f"of {cfg.block_size} tokens needs {block_bytes} bytes for this model; "
                             "raise the budget, or lower block_size")
        return int(blocks)

    # -- requests -------------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model directory has no tokenizer files: pass prompts as "
                                 "lists of token ids")
            return list(self.tokenizer.encode(prompt, add_special_tokens=True))
        if not isinstance(prompt, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError("a prompt must be a string or a list of integer token ids")
        return list(prompt)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue one request; returns its id. Raises ValueError (queueing nothing) for a
        bad prompt or a request whose KV cannot fit in the pool even alone."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        token_ids = self.tokenize(prompt)
        max_model_len = self.config.max_model_len
        vocab = self.model_config.vocab_size
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(token_ids) >= max_model_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens but max_model_len is "
                             f"{max_model_len}, which leaves no room to generate: shorten the "
                             "prompt or raise max_model_len")
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        max_len = max_model_len if params.max_tokens is None else min(
            max_model_len, len(token_ids) + params.max_tokens)
        # The last sampled token's K/V is never written, so max_len - 1 tokens need slots.
        need = self.kv.blocks_for_tokens(max_len - 1)
        if need > self.num_kv_blocks:
            raise ValueError(f"this request needs up to {need} KV blocks (prompt {len(token_ids)} + "
                             f"max_tokens {params.max_tokens}) but the pool has only "
                             f"{self.num_kv_blocks}: lower max_tokens or enlarge the KV budget")
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = Request(request_id, token_ids, params, seed, max_len,
                          frozenset() if params.ignore_eos else self.eos_token_ids,
                          prompt=prompt if isinstance(prompt, str) else None)
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def abort_request(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return
        self.scheduler.finish(request)
        request.finish("abort")

    def abort_all(self, request_ids) -> None:
        """Abort and forget these requests after a failed step. Full blocks are registered in the
        prefix cache when their step is scheduled, so a step that raised may have left cached blocks
        whose K/V was never written: drop every cached block nobody holds."""
        for rid in request_ids:
            self.abort_request(rid)
            self.requests.pop(rid, None)
        self.block_pool.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -------------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, list[int]]]:
        """Run one engine step. Returns (request, tokens appended this step) for every request that
        produced a token or finished (more than one token when speculative drafts were accepted)."""
        t0 = time.perf_counter()
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, set(self.requests))
        sched = self.scheduler.schedule()
        produced: list[tuple[Request, list[int]]] = []
        finished: list[str] = []
        spec_runs, verify_s = {}, 0.0
        if sched.scheduled:
            draft_probs = self.spec.draft_probs(sched.scheduled) if self.spec is not None else None
            t1 = time.perf_counter()
            runs, logits = self.runner.execute(sched.scheduled, self.kv, draft_probs)
            verify_s = time.perf_counter() - t1
            sampling = [s for s in sched.scheduled if s.samples]
            for s in sched.scheduled:
                s.request.num_computed_tokens += s.num_new_tokens
            if self.keep_logits and logits is not None:
                first = np.cumsum([0] + [1 + len(s.draft_token_ids) for s in sampling])
                self.last_logits = {s.request.request_id: logits[first[i]]
                                    for i, s in enumerate(sampling)}
            if self.spec is not None:
                spec_runs = self.spec.record(sampling, runs, verify_s)
            for s, run in zip(sampling, runs, strict=True):
                request = s.request
                if s.draft_token_ids:
                    # Roll back the rejected drafts: their K/V slots are past the accepted run.
                    request.num_computed_tokens -= len(s.draft_token_ids) - (len(run) - 1)
                    self.kv.trim(request)
                appended = []
                for token in run:  # stop checks token by token; a stop truncates the rest
                    request.append_token(token)
                    appended.append(token)
                    if self._check_stop(request, token):
                        self.scheduler.finish(request)
                        finished.append(request.request_id)
                        break
                produced.append((request, appended))
        self._record(sched, finished, time.perf_counter() - t0)
        if spec_runs:
            trace = self.trace[-1]
            trace.spec_runs = spec_runs
            trace.num_draft_tokens = sum(k for k, _ in spec_runs.values())
            trace.num_accepted_tokens = sum(a for _, a in spec_runs.values())
            trace.propose_s, trace.verify_s = self.spec.last_propose_s, verify_s
        return produced

    def _check_stop(self, request: Request, token: int) -> bool:
        params = request.params
        if token in request.eos_token_ids or token in params.stop_token_ids:
            request.finish("stop", token)
        elif params.stop and self.tokenizer is not None:
            text = self.decode(request.output_token_ids)
            hits = [(text.find(s), s) for s in params.stop if s in text]
            if hits:
                pos, stop = min(hits)
                request.output_text = text[:pos]
                request.finish("stop", stop)
        if not request.is_finished and request.num_tokens >= request.max_len:
            request.finish("length")
        return request.is_finished

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _record(self, sched, finished: list[str], duration: float) -> None:
        prefill = sum(s.num_new_tokens for s in sched.scheduled
                      if s.request.num_computed_tokens - s.num_new_tokens
                      < len(s.request.prompt_token_ids))
        pool = self.block_pool
        self.trace.append(StepTrace(
            step=self._steps,
            request_ids=[s.request.request_id for s in sched.scheduled],
            num_prefill_tokens=prefill,
            num_decode_tokens=sched.num_tokens - prefill,
            num_tokens=sched.num_tokens,
            blocks_used=pool.num_used_blocks,
            blocks_free=pool.num_free_blocks,
            blocks_cached=pool.num_cached_free_blocks,
            num_preempted=len(sched.preempted),
            preempted_ids=list(sched.preempted),
            finished_ids=finished,
            block_tables={rid: list(t.blocks) for rid, t in self.kv.tables.items()},
            duration_s=duration,
        ))
        self._steps += 1

    # -- outputs --------------------------------------------------------------------------------
    def make_output(self, request: Request) -> RequestOutput:
        if not (request.finish_reason == "stop" and isinstance(request.stop_reason, str)):
            request.output_text = self.decode(request.output_token_ids)
        ttft = decode = e2e = None
        if request.first_token_time is not None:
            ttft = request.first_token_time - request.arrival_time
        if request.finish_time is not None:
            e2e = request.finish_time - request.arrival_time
            if request.first_token_time is not None:
                decode = request.finish_time - request.first_token_time
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            outputs=[CompletionOutput(0, request.output_text, list(request.output_token_ids),
                                      request.finish_reason, request.stop_reason)],
            finished=request.status == RequestStatus.FINISHED,
            metrics=RequestMetrics(ttft, decode, e2e, request.num_preemptions,
                                   request.num_cached_tokens,
                                   None if request.spec_stats is None else request.spec_stats.as_dict()),
        )

    def pop_finished(self, request_id: str) -> RequestOutput:
        """The output of a finished request, forgetting the request."""
        return self.make_output(self.requests.pop(request_id))


def _generation_eos(model_dir: str) -> frozenset[int]:
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return frozenset()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, OSError):
        return frozenset()
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])

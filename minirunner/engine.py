"""LLMEngine: the loop — admit requests, schedule a step, run it, append tokens, finish, report.

Owns request validation at admission, the per-step trace (minirunner/trace.py), stop conditions (EOS,
max_tokens, max_model_len, stop strings) with incremental detokenisation, n > 1 groups, logprobs
collection and outputs. A request refused at admission raises ValueError and leaves every other request
untouched; an abort frees only that request's blocks. With ``async_scheduling``, a steady speculative
batch's steps are launched one step ahead by minirunner/spec/async_loop.py, which applies their tokens
through the same stop checks.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from minirunner.attention import get_backend_class, resolve_backend_name
from minirunner.config import EngineConfig, ModelConfig
from minirunner.detokenizer import IncrementalDetokenizer
from minirunner.generation_config import generation_eos_ids
from minirunner.input_processor import InputProcessor, ProcessedPrompt
from minirunner.kv.contiguous import ContiguousKVManager
from minirunner.kv.manager import KVCacheManager
from minirunner.logprobs import collect_step_logprobs
from minirunner.memory_profile import profile_kv_budget
from minirunner.model.loader import load_model
from minirunner.outputs import RequestOutput, build_request_output
from minirunner.parallel_sampling import child_id, child_seed, fork_children
from minirunner.request import Request
from minirunner.runner import ModelRunner, StepGraphInfo
from minirunner.sampling_params import SamplingParams
from minirunner.scheduler import Scheduler
from minirunner.spec.async_loop import AsyncSpeculation
from minirunner.spec.config import SpeculativeConfig
from minirunner.spec.speculator import Speculator
from minirunner.tokenizer import load_tokenizer
from minirunner.trace import StepTrace

_DEFAULT_CPU_KV_BYTES = 1 << 30
TRACE_MAX_STEPS = 10_000


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig | None = None):
        self.config = config
        self.model_config = model_config or ModelConfig.from_dir(config.model)
        config.validate(self.model_config)
        self.tokenizer = load_tokenizer(config.tokenizer or config.model, config.tokenizer_mode)
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_ids = (frozenset(self.model_config.eos_token_ids)
                              | generation_eos_ids(config.model)
                              | frozenset(() if tokenizer_eos is None else (tokenizer_eos,)))
        torch.manual_seed(config.seed)
        self.num_threads = _configure_cpu_threads(config, self.model_config)
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
        if config.kv_layout == "paged":
            self.kv = KVCacheManager(self.num_kv_blocks, config.block_size,
                                     config.enable_prefix_caching, _cache_salt(config, mc))
        else:
            self.kv = ContiguousKVManager(self.num_kv_blocks, config.block_size, config.max_model_len,
                                          exact=config.kv_layout == "contiguous_exact")
        self.block_pool = self.kv.pool
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, self.backend, self.num_kv_blocks, config.block_size,
                                  config.max_num_seqs, config.max_num_batched_tokens,
                                  config.max_model_len)
        if config.graph_mode != "none":
            from minirunner.graphs import capture_sizes

            self.runner.enable_graphs(
                config.graph_mode, capture_sizes(config.max_num_seqs, config.cudagraph_capture_sizes),
                0 if spec_config is None else spec_config.max_num_speculative_tokens)
        self.spec = None if spec_config is None else Speculator(spec_config, config,
                                                                self.num_kv_blocks)
        self.async_spec = None
        if config.async_scheduling:
            if spec_config is None or spec_config.method != "draft_model":
                raise ValueError("async_scheduling schedules the draft-model speculative step one step "
                                 "ahead: pass speculative_config={'method': 'draft_model', ...} (n-gram "
                                 "lookup reads the accepted tokens on the host), or async_scheduling=False")
            if not self.backend.supports_verify_graphs:
                raise ValueError(f"async_scheduling needs an attention backend whose graph steps plan on "
                                 f"the device (torch or triton), not {backend_name!r}")
            self.async_spec = AsyncSpeculation(self)
        self.input_processor = InputProcessor(self.tokenizer, mc.vocab_size, config.max_model_len,
                                              config.max_logprobs, self.kv.reservation_blocks,
                                              lambda: self.num_kv_blocks)
        self.requests: dict[str, Request] = {}  # every live completion, by its own id
        self.groups: dict[str, list[Request]] = {}  # add_request's id -> its n completions
        self._token_text: dict[int, str] = {}
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
            # vLLM's rule: total x utilisation - the peak of a profiling forward at the largest batch.
            budget = profile_kv_budget(self.model, cfg, mc)
            source = (f"gpu_memory_utilization={cfg.gpu_memory_utilization} of total GPU memory "
                      "minus the profiled peak")
        else:
            # max_num_seqs full-length requests, plus the null block (paid for below)
            per_seq = -(-cfg.max_model_len // cfg.block_size) * block_bytes
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

    # -- requests -------------------------------------------------------------------------------
    def tokenize(self, prompt) -> list[int]:
        """The token ids of one prompt (a string, token ids, or a vLLM prompt dict)."""
        return self.input_processor.parse(prompt)[0]

    def process_input(self, prompt, params: SamplingParams | None = None) -> ProcessedPrompt:
        """Validate one request without queueing it (minirunner/input_processor.py); raises ValueError."""
        processed = self.input_processor.process(prompt, params or SamplingParams())
        self._check_params(processed.params)
        return processed

    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue one request (a prompt in any of vLLM's forms, or a ProcessedPrompt);
        returns its id. Raises ValueError (queueing nothing, every other request still served) for a
        bad prompt or a request whose KV cannot fit in the pool even alone."""
        if not isinstance(prompt, ProcessedPrompt):
            prompt = self.process_input(prompt, params)
        token_ids, params = prompt.token_ids, prompt.params
        max_model_len = self.config.max_model_len
        max_len = max_model_len if params.max_tokens is None else min(
            max_model_len, len(token_ids) + params.max_tokens)
        request_id = str(next(self._ids)) if request_id is None else request_id
        ids = [child_id(request_id, i) for i in range(params.n)]
        if request_id in self.groups or any(i in self.requests for i in ids):
            raise ValueError(f"request id {request_id!r} is already in use")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        group = [Request(cid, token_ids, params, child_seed(seed, i), max_len,
                         frozenset() if params.ignore_eos else self.eos_token_ids,
                         prompt=prompt.text,
                         group_id=request_id, index=i) for i, cid in enumerate(ids)]
        for request in group:
            if self.tokenizer is not None and params.detokenize:
                request.detok = IncrementalDetokenizer(
                    self.tokenizer, params.skip_special_tokens, params.stop,
                    params.include_stop_str_in_output, params.min_tokens, token_ids)
            if params.logprobs is not None:
                request.logprobs, request.cumulative_logprob = [], 0.0
            self.requests[request.request_id] = request
        if params.prompt_logprobs is not None:
            group[0].prompt_logprobs = [None]
        group[0].fork_children = group[1:]
        self.groups[request_id] = group
        self.scheduler.add(group[0])
        return request_id

    def _check_params(self, params: SamplingParams) -> None:
        """The checks that need the model: token ids in the vocabulary, a tokenizer for stop strings."""
        vocab = self.model_config.vocab_size
        bad = sorted(t for t in (params.logit_bias or {}) if t >= vocab)
        if bad:
            raise ValueError(f"logit_bias names token ids {bad[:5]} outside the vocabulary "
                             f"[0, {vocab}): use ids of this model's tokenizer")
        bad = sorted(t for t in params.stop_token_ids if t >= vocab)
        if bad:
            raise ValueError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer but this model directory has none: use "
                             "stop_token_ids instead")
        if params.n > 1 and self.config.kv_layout != "paged":
            raise ValueError(f"n={params.n} completions share the prompt's KV blocks, which a contiguous "
                             "reservation cannot: use kv_layout='paged', or n=1")

    def abort_request(self, request_id: str) -> None:
        """Abort a request (every completion of a group id, or one completion by its own id): only
        its blocks are freed; full blocks it computed stay in the prefix cache."""
        group = self.groups.get(request_id)
        targets = group if group is not None else [self.requests.get(request_id)]
        for request in targets:
            if request is None or request.is_finished:
                continue
            self._free(request)
            request.finish("abort")
            if request.detok is not None:
                request.detok.finish()

    def abort_all(self, request_ids) -> None:
        """Abort and forget these requests (a stream left early, or an error in the caller). Only
        their blocks are freed; what a failed step may have half-written was dropped by that step."""
        for rid in request_ids:
            self.abort_request(rid)
            for request in self.groups.pop(rid, []):
                self.requests.pop(request.request_id, None)
            self.requests.pop(rid, None)

    def _free(self, request: Request) -> None:
        """Free a finished or aborted request's blocks and its runner state."""
        self.scheduler.finish(request)
        self.runner.logits_processors.release(request.request_id)
        self.runner.free_request(request.request_id)
        if self.spec is not None:
            self.spec.proposer.free(request.request_id)

    def _step_failed(self, sched) -> None:
        """The step raised mid-forward: blocks it registered in the prefix cache may hold half-written
        K/V, so forget their keys, and abort the requests it ran (their K/V is in an unknown state)."""
        self.kv.drop_step_cache()
        for s in sched.scheduled:
            if not s.request.is_finished:
                self._free(s.request)
                s.request.finish("abort")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -------------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, list[int]]]:
        """Run one engine step. Returns (request, tokens appended this step) for every request that
        produced a token or finished (more than one token when speculative drafts were accepted)."""
        if self.async_spec is not None:
            produced = self.async_spec.step()  # None: this step runs synchronously, below
            if produced is not None:
                return produced
        t0 = time.perf_counter()
        self.kv.begin_step()
        if self.spec is not None:
            # A finished request's draft KV went back in _free; any other non-live state goes here.
            self.spec.propose(self.scheduler.running,
                              {rid for rid, r in self.requests.items() if not r.is_finished},
                              self.scheduler.may_join())
        sched = self.scheduler.schedule()
        for request_id in sched.preempted:
            self.runner.free_request(request_id)
        produced: list[tuple[Request, list[int]]] = []
        finished: list[str] = []
        occupancy = None
        self.runner.last_step = StepGraphInfo()
        spec_runs, verify_s = {}, 0.0
        if sched.scheduled:
            draft_probs = self.spec.draft_probs(sched.scheduled) if self.spec is not None else None
            try:
                copies = self.kv.take_copies()  # copy-on-write of shared blocks, before any write
                self.runner.copy_blocks([c[0] for c in copies], [c[1] for c in copies])
                t1 = time.perf_counter()
                runs, logits = self.runner.execute(sched.scheduled, self.kv, draft_probs)
                verify_s = time.perf_counter() - t1
            except BaseException:
                self._step_failed(sched)
                raise
            self._collect_logprobs(sched.scheduled)
            sampling = [s for s in sched.scheduled if s.samples]
            for s in sched.scheduled:
                s.request.num_computed_tokens += s.num_new_tokens
            if self.keep_logits and logits is not None:
                first = np.cumsum([0] + [1 + len(s.draft_token_ids) for s in sampling])
                self.last_logits = {s.request.request_id: logits[first[i]]
                                    for i, s in enumerate(sampling)}
            if self.spec is not None:
                spec_runs = self.spec.record(sampling, runs, verify_s)
            done = []
            for s, run in zip(sampling, runs, strict=True):
                request = s.request
                if s.draft_token_ids:
                    # Roll back the rejected drafts: their K/V slots are past the accepted run.
                    request.num_computed_tokens -= len(s.draft_token_ids) - (len(run) - 1)
                    self.kv.trim(request)
                produced.append((request, self._append_run(request, run, done, finished)))
            occupancy = self._occupancy()  # the step's peak: before finished requests free blocks
            for request in done:
                self._free(request)
        self._record(sched, finished, occupancy or self._occupancy(),
                     sum(len(tokens) for _, tokens in produced), time.perf_counter() - t0)
        if spec_runs:
            self._record_spec(spec_runs, self.spec.last_propose_s, verify_s)
        return produced

    def _append_run(self, request: Request, run: list[int], done: list[Request],
                    finished: list[str]) -> list[int]:
        """Append a step's emitted tokens to ``request`` with the stop checks token by token (a stop
        truncates the rest of the run); a request that stops joins ``done`` and ``finished``. Returns
        the tokens appended."""
        appended = []
        for token in run:
            request.append_token(token)
            appended.append(token)
            if request.fork_children:
                fork_children(request, self.kv, self.scheduler)
            if self._check_stop(request, token):
                done.append(request)
                finished.append(request.request_id)
                break
        return appended

    def _record_spec(self, spec_runs: dict[str, list[int]], propose_s: float, verify_s: float) -> None:
        """The speculative part of the last step's trace entry."""
        trace = self.trace[-1]
        trace.spec_runs = spec_runs
        trace.num_draft_tokens = sum(k for k, _ in spec_runs.values())
        trace.num_accepted_tokens = sum(a for _, a in spec_runs.values())
        trace.propose_s, trace.verify_s = propose_s, verify_s

    def _check_stop(self, request: Request, token: int) -> bool:
        """vLLM's rules: before min_tokens only the length limit ends a request; EOS ends it with
        stop_reason None, a stop token id with the id (neither token's text is added unless
        include_stop_str_in_output), a stop string with the string."""
        params = request.params
        detok = request.detok
        past_min = len(request.output_token_ids) >= params.min_tokens
        stop_string = None
        if past_min and (token in request.eos_token_ids or token in params.stop_token_ids):
            if detok is not None and params.include_stop_str_in_output:
                detok.append(token)
            request.finish("stop", None if token in request.eos_token_ids else token)
        else:
            stop_string = detok.append(token) if detok is not None else None
            if stop_string is not None:
                request.finish("stop", stop_string)
            elif request.num_tokens >= request.max_len:
                request.finish("length")
        if request.is_finished and detok is not None:
            detok.finish(stopped_by_string=stop_string is not None)
        return request.is_finished

    def take_text_delta(self, request: Request) -> str:
        """Text of ``request`` not streamed yet that can never be taken back (see detokenizer.py)."""
        return request.detok.take_delta() if request.detok is not None else ""

    def _decode_token(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _collect_logprobs(self, scheduled) -> None:
        collect_step_logprobs(self.requests, scheduled, self.runner.last_prompt_logprobs,
                              self.runner.last_logprobs, self._decode_token)

    def _occupancy(self) -> dict:
        """Blocks and KV slots in use now, and (with trace_block_tables) every block table."""
        pool, block_size = self.block_pool, self.config.block_size
        # A shared block holds its tokens once. Counting it as full is exact for prefix-cache hits (only
        # full blocks are shared) and over-subtracts a fork's partial prompt block until it is copied.
        held = sum(r.num_computed_tokens for r in self.scheduler.running) - block_size * pool.num_shared_refs
        return dict(
            blocks_used=pool.num_used_blocks, blocks_free=pool.num_free_blocks,
            blocks_cached=pool.num_cached_free_blocks if self.kv.enable_prefix_caching else 0,
            kv_slots_used=held, kv_slots_allocated=pool.num_used_blocks * block_size,
            num_running=len(self.scheduler.running),
            block_tables=({rid: list(t.blocks) for rid, t in self.kv.tables.items()}
                          if self.config.trace_block_tables else {}))

    def _record(self, sched, finished: list[str], occupancy: dict, num_output_tokens: int,
                duration: float) -> None:
        prefill = sum(s.num_new_tokens for s in sched.scheduled
                      if s.request.num_computed_tokens - s.num_new_tokens
                      < len(s.request.prompt_token_ids))
        self.trace.append(StepTrace(
            step=self._steps,
            request_ids=[s.request.request_id for s in sched.scheduled],
            num_prefill_tokens=prefill,
            num_decode_tokens=sched.num_tokens - prefill,
            num_tokens=sched.num_tokens,
            num_output_tokens=num_output_tokens,
            blocks_used_after=self.block_pool.num_used_blocks,
            num_waiting=len(self.scheduler.waiting),
            num_preempted=len(sched.preempted),
            preempted_ids=list(sched.preempted),
            finished_ids=finished,
            duration_s=duration,
            graph=self.runner.last_step.graph,
            bucket_size=self.runner.last_step.bucket_size,
            num_padded_rows=self.runner.last_step.num_padded_rows,
            **occupancy,
        ))
        self._steps += 1

    # -- outputs --------------------------------------------------------------------------------
    def group_finished(self, group_id: str) -> bool:
        """Have all n completions of this request finished? (False once its output was popped.)"""
        group = self.groups.get(group_id)
        return group is not None and all(r.is_finished for r in group)

    def make_output(self, request: Request) -> RequestOutput:
        """The RequestOutput of the group ``request`` belongs to (its n completions, in index order)."""
        return build_request_output(self.groups.get(request.group_id) or [request])

    def pop_finished(self, request_id: str) -> RequestOutput:
        """The output of a finished request (the id add_request returned), forgetting the request."""
        group = self.groups.pop(request_id, None) or [self.requests[request_id]]
        for r in group:
            self.requests.pop(r.request_id, None)
        return build_request_output(group)


def _cache_salt(config: EngineConfig, model_config: ModelConfig) -> bytes:
    """What makes K/V of equal tokens differ between engines: the model and the KV dtype."""
    text = f"{Path(config.model).resolve()}|{model_config}|{config.dtype}"
    return hashlib.sha256(text.encode()).digest()


def _configure_cpu_threads(config: EngineConfig, model_config: ModelConfig) -> int:
    """On a CPU, set torch's intra-op threads: ``num_threads`` if given; under "auto" one per core this
    process may run on; under None, torch's own setting. Returns the number in force (process-wide).

    Measured on a quiet 2-core machine with the embedded model (benchmarks/README.md): two threads beat
    one at batch 1 and by a third at 64 ragged requests. On an oversubscribed machine (more runnable
    threads than cores, e.g. other jobs) every multi-threaded operator waits for a descheduled thread,
    and one thread is far faster: pass num_threads=1 there."""
    if config.device.type == "cpu" and config.num_threads is not None:
        if config.num_threads == "auto":
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                      else os.cpu_count() or 1))
        else:
            torch.set_num_threads(config.num_threads)
    return torch.get_num_threads()

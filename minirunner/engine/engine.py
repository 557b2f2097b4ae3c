"""LLMEngine: the loop — admit requests, then step: schedule → execute → apply → trace.

Owns the live requests and their n-way groups, admission (a request refused raises ValueError and leaves
every other request untouched), abort (frees only that request's blocks) and the step itself. The parts
are built once by engine/build.py; a step's results travel as return values: the runner's RunnerOutput
(worker/runner_output.py) is applied by the OutputProcessor (engine/output_processor.py) and recorded by
the StepTracer (engine/trace.py). With ``async_scheduling`` the same loop launches step N + 1 before
it reads step N (engine/in_flight.py says when it may: plain decode, and a draft model's steady batch,
whose drafts the worker proposed on the device); every step is launched, read and applied the same way.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass

from minirunner.config import EngineConfig, ModelConfig
from minirunner.core.sync_check import sync_check
from minirunner.engine.build import build_engine
from minirunner.engine.detokenizer import IncrementalDetokenizer
from minirunner.engine.in_flight import InFlightStep, may_continue, may_verify_ahead
from minirunner.engine.input_processor import InputProcessor, ProcessedPrompt
from minirunner.engine.output_processor import OutputProcessor
from minirunner.engine.parallel_sampling import child_id, child_seed
from minirunner.engine.request import Request
from minirunner.engine.request_queue import check_priority
from minirunner.engine.trace import StepTracer
from minirunner.engine_scope import EngineScope, in_engine_scope
from minirunner.generation_config import generation_eos_ids
from minirunner.metrics.reader import Metric
from minirunner.metrics.stats import EngineMetrics
from minirunner.outputs import RequestOutput, build_request_output
from minirunner.sampling_params import SamplingParams
from minirunner.structured_output.manager import StructuredOutputManager
from minirunner.tokenizer import load_tokenizer
from minirunner.worker.runner_output import RunnerOutput, StepGraphInfo


@dataclass(eq=False)
class EngineStep:
    """One step's results: (request, tokens appended) per request that produced a token or finished,
    and the runner's output (None when nothing ran)."""

    produced: list[tuple[Request, list[int]]]
    runner_output: RunnerOutput | None = None


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig | None = None):
        self.model_config = mc = model_config or ModelConfig.from_dir(config.model)
        self.config = config = config.resolved(mc)
        self.tokenizer = load_tokenizer(config.tokenizer or config.model, config.tokenizer_mode)
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_ids = (frozenset(mc.eos_token_ids) | generation_eos_ids(config.model)
                              | frozenset(() if tokenizer_eos is None else (tokenizer_eos,)))
        self._rng = random.Random(config.seed)  # private: the caller's generators are never seeded
        self.scope = EngineScope.for_config(config)  # threads, compile cache: set for its work only
        with self.scope.applied():
            parts = build_engine(config, mc)
        self.num_threads, self.model, self.backend = parts.num_threads, parts.model, parts.backend
        self.num_kv_blocks, self.kv, self.block_pool = parts.num_kv_blocks, parts.kv, parts.kv.pool
        self.scheduler, self.runner, self.spec = parts.scheduler, parts.runner, parts.spec
        self.pending: InFlightStep | None = None  # async scheduling: the step launched, not yet read
        self.check_no_sync = False  # CUDA: raise if preparing and launching a step waits for the device
        self.structured = StructuredOutputManager(self.tokenizer, mc.vocab_size, self.eos_token_ids)
        self.input_processor = InputProcessor(self.tokenizer, mc.vocab_size, config.max_model_len,
                                              config.max_logprobs, self.kv.reservation_blocks,
                                              lambda: self.num_kv_blocks, config.kv_layout == "paged",
                                              self.structured.compile)
        self.output_processor = OutputProcessor(self.tokenizer, self.kv)
        self.detokenize = True  # False: stop strings and text are the caller's (the server's output thread)
        self.metrics = EngineMetrics.for_engine(config, parts.spec_config)  # the one set: get_metrics
        self.scheduler.metrics = self.metrics  # admissions are prefix-cache queries
        self.tracer = StepTracer(self.kv, self.scheduler, config.block_size, config.trace_block_tables)
        self.trace = self.tracer.trace
        self.requests: dict[str, Request] = {}  # every live completion, by its own id
        self.groups: dict[str, list[Request]] = {}  # add_request's id -> its n completions
        self._ids = itertools.count()

    # -- requests -------------------------------------------------------------------------------
    def tokenize(self, prompt) -> list[int]:
        """The token ids of one prompt (a string, token ids, or a vLLM prompt dict)."""
        return self.input_processor.parse(prompt)[0]

    def process_input(self, prompt, params: SamplingParams | None = None) -> ProcessedPrompt:
        """Validate one request without queueing it (engine/input_processor.py); raises ValueError."""
        return self.input_processor.process(prompt, params or SamplingParams())

    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0) -> str:
        """Validate and queue one request (a prompt in any of vLLM's forms, or a ProcessedPrompt);
        returns its id. Raises ValueError (queueing nothing, every other request still served) for a bad
        prompt, a KV need over the whole pool, or a non-zero ``priority`` under the "fcfs" policy."""
        check_priority(priority, self.config.scheduling_policy)
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
                         prompt=prompt.text, priority=priority,
                         group_id=request_id, index=i) for i, cid in enumerate(ids)]
        for request in group:
            if self.tokenizer is not None and params.detokenize and self.detokenize:
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

    def abort_request(self, request_id: str) -> None:
        """Abort a group (every completion) or one completion, by id: only its blocks are freed."""
        group = self.groups.get(request_id)
        targets = group if group is not None else [self.requests.get(request_id)]
        for request in targets:
            if request is None or request.is_finished:
                continue
            self.free_request(request)
            request.finish("abort")
            self.metrics.record_finished(request)
            if request.detok is not None:
                request.detok.finish()
        self.metrics.record_state(self.scheduler, self.block_pool)

    def abort_all(self, request_ids) -> None:
        """Abort and forget these requests (a stream left early, or an error in the caller). Only
        their blocks are freed; what a failed step may have half-written was dropped by that step."""
        for rid in request_ids:
            self.abort_request(rid)
            for request in self.groups.pop(rid, []):
                self.requests.pop(request.request_id, None)
            self.requests.pop(rid, None)

    def free_request(self, request: Request) -> None:
        """Free a finished or aborted request's blocks (the worker forgets it with the next step)."""
        self.scheduler.finish(request)
        self.structured.free(request.request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self.pending is not None

    # -- the loop -------------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, list[int]]]:
        """Run one engine step. Returns (request, tokens appended this step) for every request that
        produced a token or finished (more than one token when speculative drafts were accepted)."""
        return self.execute_step().produced

    @in_engine_scope
    def execute_step(self) -> EngineStep:
        """One step: schedule → execute (launch; drafts are proposed after sampling) → apply → trace.
        Synchronous: the step is launched and applied here. With ``async_scheduling`` the step
        launched here is applied by the next call, after that call launched its own (vLLM's async
        scheduling: step N + 1 is queued before step N's tokens are read; stop checks run one step
        late). A step in flight whose
        requests cannot continue without the host (engine/in_flight.py) is read first, launching
        nothing: the next call then runs as the synchronous engine does."""
        prev, self.pending = self.pending, None
        try:
            launched = self._launch_next(prev)
        except BaseException:  # the step in flight stays in flight
            self.pending = prev
            raise
        done = self._finish(prev) if prev is not None else EngineStep([])
        if launched is None:
            return done
        if self.config.async_scheduling:
            self.pending = launched
            return done
        return self._finish(launched)

    def _launch_next(self, prev: InFlightStep | None) -> InFlightStep | None:
        """The next step, launched, unless ``prev`` must be read first (None). A step whose drafts the
        worker proposed on the device is followed by a verify step of them (placeholders on the host:
        the worker gathers the drafts there) while the batch stays steady."""
        if prev is not None:
            running = self.scheduler.running
            if prev.output.drafts is not None:
                k = self.spec.step_k(running)
                if not may_verify_ahead(prev, self.scheduler, self.kv, k, self.config.max_model_len):
                    return None
                for request in running:
                    request.spec_token_ids = [-1] * k
            elif not may_continue(prev, self.spec is not None and self.spec.choose_k(len(running)) > 0):
                return None
        return self._launch(prev)

    def _launch(self, prev: InFlightStep | None) -> InFlightStep | None:
        """Schedule and launch one step (None: nothing to run; the idle step is traced). The drafts it
        verifies came back with the last step read (``Scheduler.update_draft_token_ids``)."""
        t0 = time.perf_counter()
        self.kv.begin_step()
        k = propose_s = 0
        if self.spec is not None:  # the drafts scheduled now were proposed after the last step sampled
            k = self.spec.plan(self.scheduler.running)
            propose_s = self.spec.propose_s
        sched = self.scheduler.schedule(k)
        sched.output.grammar_bitmask = self.structured.bitmasks(sched.scheduled)
        self.metrics.record_schedule(len(sched.preempted))
        if not sched.scheduled:
            self.tracer.record(sched, finished=[], occupancy=self.tracer.occupancy(), num_output_tokens=0,
                               duration=time.perf_counter() - t0, graph=StepGraphInfo())
            self.metrics.record_state(self.scheduler, self.block_pool)
            return None
        t1 = time.perf_counter()
        try:
            with sync_check(self.check_no_sync and prev is not None, self.runner.device):
                output = self.runner.execute(sched.output,
                                             prev.output.prev_sampled() if prev is not None else None)
        except BaseException:
            self._abort_failed([s.request for s in sched.scheduled])
            raise
        self.scheduler.update_after_launch(sched)
        return InFlightStep(sched, output, t0, propose_s, time.perf_counter() - t1, ahead=prev is not None)

    def _abort_failed(self, requests) -> None:
        """A launch raised: abort the requests it was to run (their K/V is in an unknown state) and forget
        the prefix-cache keys of the blocks it registered (they may be half-written)."""
        self.kv.drop_step_cache()
        for request in requests:
            if not request.is_finished:
                self.free_request(request)
                request.finish("abort")
                self.metrics.record_finished(request)
        self.metrics.record_state(self.scheduler, self.block_pool)

    def _finish(self, step: InFlightStep) -> EngineStep:
        """Read a launched step (waiting for it only) and apply it: tokens with stop checks, forks,
        speculative rollback and metrics, finished requests freed, a trace entry."""
        out = step.output.get_output()
        # speculation's bookkeeping takes the requests still live before this step is applied: what the
        # step computed for one that finished since is discarded
        sampling = [s for s in step.sched.scheduled if s.is_sampling]
        live = None if self.spec is None else [
            (s, run) for s, run in zip(sampling, out.runs, strict=True) if not s.request.is_finished]
        applied = self.output_processor.apply(step.sched, out, self.requests)
        self.structured.accept(applied.produced)
        for children in applied.forked:
            self.scheduler.add_forked(children)
        spec_runs = {}
        if self.spec is not None:
            self.scheduler.update_from_output([s for s, _ in live], [run for _, run in live])
            # the target's device time, read with the output (a GPU's launch returns before it runs)
            verify_s = out.device_s if out.device_s is not None else step.verify_s
            plain = all(s.num_new_tokens == 1 and s.is_sampling and not s.draft_token_ids
                        for s in step.sched.scheduled)
            spec_runs = self.spec.verified([s for s, _ in live], [run for _, run in live], self.kv,
                                           step.propose_s, verify_s, plain_decode=plain)
            self.scheduler.update_draft_token_ids(self.spec.take_drafts(out))
        occupancy = self.tracer.occupancy()  # the step's peak: before finished requests free blocks
        for request in applied.done:
            self.free_request(request)
        self.metrics.record_step(applied.produced, spec_runs, self.scheduler, self.block_pool)
        self.tracer.record(step.sched, finished=applied.finished, occupancy=occupancy,
                           num_output_tokens=sum(len(tokens) for _, tokens in applied.produced),
                           duration=time.perf_counter() - step.t0, graph=out.graph, spec_runs=spec_runs,
                           propose_s=step.propose_s, verify_s=step.verify_s, scheduled_ahead=step.ahead)
        return EngineStep(applied.produced, out)

    def get_metrics(self) -> list[Metric]:
        """vLLM's metric records, now (minirunner/metrics/stats.py); safe from another thread."""
        return self.metrics.snapshot()

    def take_text_delta(self, request: Request) -> str:
        """Text of ``request`` not streamed yet that can never be taken back (see detokenizer.py)."""
        return request.detok.take_delta() if request.detok is not None else ""

    # -- outputs --------------------------------------------------------------------------------
    def group_finished(self, group_id: str) -> bool:
        """Have all n completions of this request finished? (False once its output was popped.)"""
        group = self.groups.get(group_id)
        return group is not None and all(r.is_finished for r in group)

    def pop_finished(self, request_id: str) -> RequestOutput:
        """The output of a finished request (the id add_request returned), forgetting the request."""
        group = self.groups.pop(request_id, None) or [self.requests[request_id]]
        for r in group:
            self.requests.pop(r.request_id, None)
        return build_request_output(group)


"""Scheduler: continuous batching with chunked prefill and recompute preemption.

Owns which requests run each step and how many of their tokens, under a per-step token budget
(``max_num_batched_tokens``) and ``max_num_seqs``. Running requests go first (decode tokens and
unfinished prefill chunks); when the pool runs dry the newest running request (with the priority
policy: the least urgent) is preempted (its blocks freed, its tokens recomputed later); waiting requests
are admitted in the queue's order (FCFS, or by priority: engine/request_queue.py) while budget and
blocks last. A request whose token is still in flight sits a step out when its next one needs that token
on the host (bad words, a pending min_tokens): the others run ahead.
It never runs the model.

Liveness: every step with work schedules tokens or preempts, else it raises. The only waiting requests
that hold blocks are forked n > 1 completions not run yet (they share the prompt's blocks); they cannot
be preempted, so when blocks run short they let go of those references first (newest in the queue
first) and recompute their prompt later (prefix-cache hits where the pool kept it). Dropping a reference
is always safe (blocks are ref-counted), and it costs less than preempting a running request.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from minirunner.core.sched.output import SchedulerOutput
from minirunner.engine.request import Request, RequestStatus
from minirunner.engine.request_queue import create_request_queue
from minirunner.engine.step_data import WorkerRowsSent
from minirunner.kv.manager import KVCacheManager
from minirunner.worker.logits_processing import needs_host_tokens


@dataclass
class ScheduledRequest:
    """One request's share of a step, fixed when it is scheduled: ``start`` (its computed tokens then:
    the step's first query position) and ``is_sampling`` (does the step reach the end of its tokens, known
    or in flight, so a new token is sampled?). The request's own counts move on once the step is
    launched, possibly before the step's tokens are read (async scheduling)."""

    request: Request
    num_new_tokens: int  # query tokens this step, starting at position ``start``
    draft_token_ids: list[int] = field(default_factory=list)  # speculative tokens after the known ones
    start: int = field(init=False)
    is_sampling: bool = field(init=False)

    def __post_init__(self) -> None:
        r = self.request
        self.start = r.num_computed_tokens
        self.is_sampling = self.start + self.num_new_tokens \
            == r.num_tokens + r.num_output_placeholders + len(self.draft_token_ids)


@dataclass
class ScheduledStep:
    """The scheduler's record of a step, on the engine's side: the live requests scheduled and the ids
    preempted. ``output``: the same step as data, for the worker (core/sched/output.py)."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    output: SchedulerOutput | None = None

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs", draft_lookahead: bool = False):
        self.kv = kv
        # a draft model's passes after a step write K/V for its k drafts past the step's tokens (the
        # slots each request's blocks set aside: vLLM's lookahead slots)
        self.draft_lookahead = draft_lookahead
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting = create_request_queue(policy)  # FCFS (a deque) or by priority: request_queue.py
        self.running: list[Request] = []
        self.metrics = None  # the engine's EngineMetrics: admissions are prefix-cache queries
        self.sent = WorkerRowsSent()  # what the worker's rows hold of each request
        # ids the worker has not been told to forget yet (sent with the next step that runs)
        self._finished: set[str] = set()
        self._preempted: list[str] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def add_forked(self, children: list[Request]) -> None:
        """Queue forked completions (in index order) ahead of every waiting request: their prompt is
        already in the cache, bar its last token, which each recomputes to draw its own first token."""
        for child in children:
            child.num_computed_tokens = len(child.prompt_token_ids) - 1
        self.waiting.extendleft(reversed(children))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def update_after_launch(self, out: ScheduledStep) -> None:
        """A step was launched: its requests' computed counts move on, and each request that samples
        holds one placeholder per token it may emit (1, or 1 + drafts) until the step is read
        (vLLM's ``_update_after_schedule``; ``OutputProcessor.apply`` takes them back)."""
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
            if s.is_sampling:
                s.request.num_output_placeholders += 1 + len(s.draft_token_ids)

    def update_from_output(self, sampled: list[ScheduledRequest], runs: list[list[int]]) -> None:
        """A step was read: each request's rejected drafts leave its computed count (their K/V slots
        lie past the accepted run). ``sampled``: the step's sampling requests still live, with the run
        each emitted (vLLM's ``update_from_output``)."""
        for s, run in zip(sampled, runs, strict=True):
            if s.draft_token_ids:
                s.request.num_computed_tokens -= len(s.draft_token_ids) - (len(run) - 1)

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """The drafts the worker proposed after a step sampled (``RunnerOutput.draft_token_ids``), for
        the next step (vLLM's ``update_draft_token_ids``). A running request not in it gets none, and so
        does one whose next tokens are not all on the host (a step launched ahead is in flight)."""
        for request in self.running:
            drafts = draft_token_ids.get(request.request_id)
            request.spec_token_ids = drafts if drafts and request.decode_ready else []

    def schedule(self, num_spec_tokens: int = 0) -> ScheduledStep:
        """The next step. ``num_spec_tokens``: the drafts its worker proposes after sampling (k)."""
        out = ScheduledStep()
        budget = self.max_num_batched_tokens

        # 1. Running requests, oldest (or, by priority, most urgent) first; preempt from the end of the
        # list (the newest, or the least urgent) when blocks run out.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            # tokens sampled by a step still in flight count as known: the device feeds them
            num_known = request.num_tokens + request.num_output_placeholders - request.num_computed_tokens
            if request.num_output_placeholders and (
                    request.num_tokens + request.num_output_placeholders >= request.max_len
                    or needs_host_tokens(request)):
                i += 1  # it ends, or its logits need the token in flight, when that token is read
                continue
            num_new = min(num_known + len(request.spec_token_ids), budget)
            while not self.kv.allocate(request, num_new + self._lookahead(request, num_new, num_spec_tokens)):
                if self._release_waiting_blocks():
                    continue
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                self.kv.cache_full_blocks(request, request.num_computed_tokens + num_new)
                # a short budget drops the last drafts; cache_full_blocks never reaches them (it stops
                # at the request's known tokens), so unverified tokens stay out of the prefix cache
                drafts = request.spec_token_ids[:max(0, num_new - num_known)]
                request.spec_token_ids = []  # scheduled: the worker proposes anew after this step
                out.scheduled.append(ScheduledRequest(request, num_new, drafts))
                budget -= num_new
                i += 1
                continue
            break  # the request preempted itself: nothing older is left to schedule

        # 2. Waiting requests in the queue's order, unless this step already had to preempt.
        while self.waiting and not out.preempted and budget > 0 \
                and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.num_output_placeholders:
                break  # preempted with a token in flight: admitted once it is read (in order)
            cached = self.kv.find_cached_prefix(request)
            remaining = request.num_tokens - request.num_computed_tokens \
                - len(cached) * self.kv.block_size
            num_new = min(remaining, budget)
            fresh = request.num_computed_tokens == 0 and request.num_preemptions == 0
            # Admit only while every running request could still grow by one block: admitting into
            # the last free blocks just forces a preemption (and a recompute) a few steps later.
            lookahead = self._lookahead(request, num_new + len(cached) * self.kv.block_size, num_spec_tokens)
            if not self.kv.allocate(request, num_new + lookahead, cached, headroom=len(self.running)):
                # Running requests free blocks as they finish; with none left, only the waiting
                # completions behind this one can (each request alone fits the pool: admission checks).
                if not self.running and self._release_waiting_blocks(keep=request):
                    continue
                break
            if fresh and self.metrics is not None:
                self.metrics.record_admission(request, len(cached) * self.kv.block_size)
            add_cached_tokens(request, len(cached) * self.kv.block_size)
            self.kv.cache_full_blocks(request, request.num_computed_tokens + num_new)
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.waiting.add_running(self.running, request)
            out.scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        if not out.scheduled and not out.preempted and self.has_unfinished() and not any(
                r.num_output_placeholders for r in itertools.chain(self.running, self.waiting)):
            head = self.waiting[0]
            raise RuntimeError(
                f"the scheduler cannot make progress: request {head.request_id} ({head.num_tokens} "
                f"tokens) cannot be admitted with {len(self.running)} running, {len(self.waiting)} "
                f"waiting and {self.kv.pool.num_free_blocks} of {self.kv.pool.num_blocks} KV blocks "
                "free; this is a bug: please report it with the engine's configuration")
        self._preempted += out.preempted
        out.output = self.sent.build(out.scheduled, self.kv.table)
        out.output.num_spec_tokens = num_spec_tokens
        if out.scheduled:  # what the worker applies first; an idle step keeps it for the next one
            out.output.preempted_req_ids, self._preempted = self._preempted, []
            out.output.finished_req_ids, self._finished = self._finished, set()
            out.output.block_copies = self.kv.take_copies()
        return out

    def _lookahead(self, request: Request, num_new: int, k: int) -> int:
        """The slots set aside past a step of ``num_new`` tokens for a draft model's k drafts: none past
        the request's last useful position (max_len - 1)."""
        if not self.draft_lookahead:
            return 0
        return max(0, min(k, request.max_len - 1 - request.num_computed_tokens - num_new))

    def _release_waiting_blocks(self, keep: Request | None = None) -> bool:
        """Drop the block references of the waiting request nearest the back of the queue that holds
        any (a forked completion not run yet), except ``keep``. Returns False if none holds blocks."""
        for request in reversed(self.waiting):
            if request is not keep and request.request_id in self.kv.tables:
                self.kv.free(request)
                self.sent.forget(request.request_id)
                request.num_computed_tokens = 0
                return True
        return False

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        self.sent.forget(request.request_id)
        request.spec_token_ids = []
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)

    def finish(self, request: Request) -> None:
        """Remove a finished (or aborted) request and free its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        self.sent.forget(request.request_id)
        self._finished.add(request.request_id)


def add_cached_tokens(request: Request, num_cached_tokens: int) -> None:
    """A request admitted with ``num_cached_tokens`` from the prefix cache: its count moves past them,
    and at its first admission its cached prompt tokens are recorded (RequestOutput.num_cached_tokens)."""
    if not num_cached_tokens:
        return
    request.num_computed_tokens += num_cached_tokens
    if request.num_preemptions == 0:  # first admission only, and prompt tokens only
        request.num_cached_tokens = min(num_cached_tokens, len(request.prompt_token_ids))

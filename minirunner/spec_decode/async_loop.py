"""AsyncSpeculation: draft-model speculative steps scheduled one step ahead (vLLM's async scheduling).

Owns when the engine may launch step N + 1 before the host has read step N's accepted tokens, the launch
itself, and reading a launched step's runs one step late. A step launched ahead is built on the device
from the previous step's outputs: the acceptance update (how many drafts passed, the next position, the
last two verified tokens) is a handful of tensor ops on the verify step's emitted runs, and it feeds the
draft's first pass and the verify step's inputs directly. So on CUDA there is no host sync between one
step's verification and the next step's input preparation: the host's one read of a step (its emitted
runs, through a pinned buffer) waits for that step only, while the next is already queued.

It runs while the batch is steady: every running request decode-ready, nothing waiting for a free seat
(max_num_seqs), k >= 1 drafts
for every request (no logits processors, logprobs or forks), one graph bucket for the batch, and room for
the worst case (blocks of both caches allocated for two full steps of k + 1 tokens; max_len not reached
within them). Anything else drains it: the launched step is read and applied, and the engine's
synchronous step takes over (that is how new requests are admitted, preemption happens, and the tail of
a request near max_tokens runs with fewer drafts). Stop checks run one step late: when a request stops
at step N, what step N + 1 computed for it is thrown away (its K/V lies past its end, in its own blocks,
which are freed; none of it was registered in the prefix cache, which takes verified blocks only).

Every step's tokens are the synchronous engine's: the same graph steps run over the same inputs, the
draft's noise and the rejection sampler are keyed by (seed, position). The draft's first pass feeds each
request's last two verified tokens (one of them already in the draft cache unless every draft passed):
a uniform query of 2, so no per-request count has to be known on the host.

Timings (propose/verify) are host time around the launches: on a CPU the work itself, on CUDA only the
launch (the device runs asynchronously).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from minirunner.engine.output_processor import AppliedStep
from minirunner.engine.request import Request
from minirunner.engine.scheduler import ScheduledRequest, SchedulerOutput
from minirunner.spec_decode.async_utils import LaunchedStep, device_ints, merge_produced, sync_check
from minirunner.spec_decode.draft_model import draft_sampling_params, draw_drafts
from minirunner.worker.cudagraph import GraphKey, GraphKind
from minirunner.worker.input_batch import graph_rows
from minirunner.worker.logits_processing import needs_logits_processing
from minirunner.worker.model_runner import ModelRunner
from minirunner.worker.runner_output import StepGraphInfo


class AsyncSpeculation:
    def __init__(self, engine):
        self.engine = engine
        self.spec = engine.spec
        self.proposer = engine.spec.proposer  # a DraftModelProposer (checked by the engine)
        self.target: ModelRunner = engine.runner
        self.draft: ModelRunner = self.proposer.runner
        self.device = engine.config.device
        self.pending: LaunchedStep | None = None
        self._draft_params: tuple | None = None  # the segment's draft sampling parameters
        self._sampled = False  # does any request of the segment sample (else greedy drafts, one-hot q)
        self.num_launched = 0  # speculative steps launched by this loop
        self.check_no_sync = False  # CUDA: raise if preparing a step ahead waits for the device

    # -- the engine's entry ---------------------------------------------------------------------
    def step(self) -> list[tuple[Request, list[int]]] | None:
        """One engine step: launch the next speculative step when the batch allows, and read the one
        before it. None: nothing is in flight and the batch does not allow it (the engine runs its
        synchronous step)."""
        if self.pending is None:
            plan = self._plan(ahead=False)
            if plan is None:
                return None
            k, bucket = plan
            self._begin_segment()
            batch = list(self.engine.scheduler.running)
            self.pending = self._guard(batch, lambda: self._launch_from_host(batch, k, bucket))
            return []
        prev = self.pending
        plan = self._plan(ahead=True)
        launched = None
        if plan is not None:
            launched = self._guard(prev.requests, lambda: self._launch_after(prev))
        produced = self._apply(prev)
        if launched is not None and any(r.is_finished for r in launched.requests):
            produced = merge_produced(produced, self._apply(launched))  # stop checks one step late: drain
            launched = None
        self.pending = launched
        if launched is None:
            self._end_segment()
        return produced

    # -- when a step may be launched ahead -------------------------------------------------------
    def _plan(self, ahead: bool) -> tuple[int, int] | None:
        """(k, bucket) of the next step if it may be launched now, with its blocks allocated; None
        otherwise. ``ahead``: a step is in flight, so the host's counts lag one step behind."""
        engine = self.engine
        running = engine.scheduler.running
        waiting = engine.scheduler.waiting and len(running) < engine.scheduler.max_num_seqs
        if not running or waiting:
            return None  # the synchronous step admits what waits while there is a free seat
        if ahead and running != self.pending.requests:
            return None  # a request finished or was aborted
        k = self.spec.choose_k(len(running))
        if k < 1 or (ahead and k != self.pending.k):
            return None
        bucket = self.target.graphs.verify_bucket(len(running), k)
        if bucket is None or self.draft.graphs.bucket(len(running), 2) != bucket:
            return None
        steps = 2 if ahead else 1  # the step in flight, if any, and the one launched now
        for r in running:
            if r.num_computed_tokens != r.num_tokens - 1 or r.num_computed_tokens < 1 or r.fork_children \
                    or needs_logits_processing(r) or r.params.logprobs is not None \
                    or r.params.prompt_logprobs is not None \
                    or r.num_tokens + steps * (k + 1) > r.max_len:
                return None
            if not ahead and not self._draft_ready(r):
                return None
        for r in running:  # worst case: every draft of every step accepted
            seq = self.proposer.seqs[r.request_id]
            end = r.num_computed_tokens + steps * (k + 1)  # target positions written, + 1
            if not engine.kv.allocate(r, end - r.num_computed_tokens) \
                    or not self.proposer.kv.allocate(seq, end - 1 - seq.num_computed_tokens):
                if not ahead:  # give back what was taken (ahead: the segment's end does)
                    for other in running:
                        engine.kv.trim(other)
                return None
        return k, bucket

    def _draft_ready(self, request: Request) -> bool:
        """Does the draft cache hold the request's verified tokens up to the last two (which the first
        draft pass feeds again)? True after a synchronous speculative step of this request."""
        seq = self.proposer.seqs.get(request.request_id)
        need = request.num_computed_tokens - 1
        return seq is not None and seq.num_computed_tokens >= need \
            and seq.tokens[:need] == request.all_token_ids[:need]

    # -- segments -------------------------------------------------------------------------------
    def _begin_segment(self) -> None:
        """A run of steps ahead starts: the batch's draft sampling parameters, and the draft K/V each
        request is known to hold."""
        batch = self.engine.scheduler.running
        self._sampled = any(r.params.temperature > 0 for r in batch)
        self._draft_params = draft_sampling_params(batch, self.device, self.draft.model.config.vocab_size) \
            if self._sampled else None
        for r in batch:  # draft K/V is known valid up to the verified tokens before the last two
            self.proposer.seqs[r.request_id].num_computed_tokens = r.num_computed_tokens - 1

    def _end_segment(self) -> None:
        """Nothing is in flight any more: give back the blocks held for the worst case and hand the
        draft's shadow sequences back to the synchronous proposer."""
        engine = self.engine
        for r in engine.scheduler.running:
            engine.kv.trim(r)
            seq = self.proposer.seqs.get(r.request_id)
            if seq is not None:
                seq.tokens = list(r.all_token_ids)
                seq.num_verified = len(seq.tokens)

    # -- launching ------------------------------------------------------------------------------
    def _guard(self, batch: list[Request], launch):
        """Run a launch; if it raises, abort the batch's requests (their K/V is in an unknown state)."""
        try:
            return launch()
        except BaseException:
            self.pending = None
            engine = self.engine
            engine.kv.drop_step_cache()
            for r in batch:
                if not r.is_finished:
                    engine.free_request(r)
                    r.finish("abort")
            raise

    @torch.inference_mode()
    def _launch_from_host(self, batch: list[Request], k: int, bucket: int) -> LaunchedStep:
        """A segment's first step: positions and the last two tokens from the host's (exact) counts."""
        with sync_check(self.check_no_sync, self.device):
            start = device_ints(self.device, [r.num_computed_tokens for r in batch])
            known = np.stack([r.token_buffer[r.num_computed_tokens - 1:r.num_computed_tokens + 1]
                              for r in batch])
            pair = device_ints(self.device, known)
            return self._launch(batch, k, bucket, start, pair[:, 0], pair[:, 1])

    @torch.inference_mode()
    def _launch_after(self, prev: LaunchedStep) -> LaunchedStep:
        """The acceptance update on the device — from ``prev``'s emitted runs, each request's accepted
        count, its new last position and its last two tokens — then the launch of the next step."""
        with sync_check(self.check_no_sync, self.device):
            a = (prev.runs >= 0).sum(dim=1, keepdim=True) - 1  # drafts accepted, per request
            start = prev.start + a[:, 0] + 1  # the new last token's position
            before, last = prev.ids.gather(1, a)[:, 0], prev.runs.gather(1, a)[:, 0]
            return self._launch(prev.requests, prev.k, prev.bucket, start, before, last)

    @torch.inference_mode()
    def _launch(self, batch: list[Request], k: int, bucket: int, start: torch.Tensor,
                before: torch.Tensor, last: torch.Tensor) -> LaunchedStep:
        """Queue one speculative step on the device: k draft passes, then the verify replay. start,
        before, last: int64 [n] on the device, each request's last verified position and the tokens at
        start - 1 and start. Reads nothing back."""
        engine, n, t0 = self.engine, len(batch), time.perf_counter()
        engine.kv.begin_step()
        copies = engine.kv.take_copies()
        self.target.copy_blocks([c[0] for c in copies], [c[1] for c in copies])
        seqs = [self.proposer.seqs[r.request_id] for r in batch]
        self._stage_rows(self.draft, [self.draft.state.sync(s, self.proposer.kv.table(s.request_id))
                                    for s in seqs], bucket, sampling=False)
        # Draft pass 0: the last two verified tokens; then one pass per further draft.
        tokens, qs = [], []
        step_ids, positions = torch.stack((before, last), 1), torch.stack((start - 1, start), 1)
        for j in range(k):
            self.draft.buffers.write_uniform(bucket, n, step_ids, positions)
            q_len = step_ids.shape[1]
            best, logits = self.draft.graphs.run(GraphKey(bucket, GraphKind.GREEDY, q_len))
            # each request's last token row (views: no index tensor)
            best, logits = best.view(bucket, q_len)[:n, -1], logits.view(bucket, q_len, -1)[:n, -1]
            if self._sampled:
                token, q = draw_drafts(logits, self._draft_params, start + j + 1)
                qs.append(q)
            else:
                token = best
            tokens.append(token)
            step_ids, positions = token[:, None], (start + j + 1)[:, None]
        propose_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        # The verify step: the last verified token and the k drafts, at start .. start + k.
        ids = torch.cat((last[:, None], torch.stack(tokens, 1)), 1)
        target = self.target
        rows = [target.state.sync(r, engine.kv.table(r.request_id)) for r in batch]
        self._stage_rows(target, rows, bucket, sampling=True)
        target.buffers.write_uniform(bucket, n, ids, start[:, None] + torch.arange(k + 1, device=self.device),
                                     sample_positions=start + 1)
        if self._sampled:
            target.graphs.write_draft_probs(torch.stack(qs, 1).reshape(n * k, -1))
        kind = GraphKind.VERIFY if self._sampled else GraphKind.VERIFY_ONEHOT
        runs, _ = target.graphs.run(GraphKey(bucket, kind, k + 1))
        runs = runs[:n].clone()  # the next replay overwrites the graph's outputs
        host, ready = None, None
        if runs.device.type == "cuda":
            host = torch.empty(runs.shape, dtype=runs.dtype, pin_memory=True)
            host.copy_(runs, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        self.num_launched += 1
        return LaunchedStep(list(batch), k, bucket, start, ids, runs, host, ready, propose_s,
                         time.perf_counter() - t1, t0)

    def _stage_rows(self, runner: ModelRunner, rows: list[int], bucket: int, sampling: bool) -> None:
        """The batch's block-table rows (and with ``sampling`` its sampling parameters), padded to the
        bucket, host to device without blocking, each through its own pinned copy (the buffers' mirror
        may still be read by a copy in flight)."""
        tables, params = graph_rows(runner.state, np.asarray(rows, dtype=np.int64), sampling)
        runner.buffers.put_graph_rows(tables, params, bucket, own_host=True)

    # -- reading a step -------------------------------------------------------------------------
    def _apply(self, step: LaunchedStep) -> list[tuple[Request, list[int]]]:
        """Read a launched step's runs (waiting for that step only) and apply them as the synchronous
        engine does: counts, metrics, tokens with stop checks, finished requests freed, a trace entry.
        Requests that finished or were aborted since the launch are skipped."""
        engine = self.engine
        if step.ready is not None:
            step.ready.synchronize()
            runs = step.host.tolist()
        else:
            runs = step.runs.tolist()
        runs = [[t for t in row if t >= 0] for row in runs]
        live = [(r, run) for r, run in zip(step.requests, runs, strict=True) if not r.is_finished]
        applied = AppliedStep()
        for r, run in live:
            c, a = r.num_computed_tokens, len(run) - 1
            r.num_computed_tokens = c + a + 1
            # the draft cache holds the verified tokens through c + min(a, k - 1)
            self.proposer.seqs[r.request_id].num_computed_tokens = c + min(a, step.k - 1) + 1
            engine.kv.cache_full_blocks(r)
            engine.output_processor.append_run(r, run, applied)
        spec_runs = self.spec.record_runs([r for r, _ in live], [step.k] * len(live),
                                          [run for _, run in live], step.propose_s, step.verify_s)
        for children in applied.forked:  # none: a segment runs no request that still forks
            engine.scheduler.add_forked(children)
        occupancy = engine.tracer.occupancy()
        for r in applied.done:
            engine.free_request(r)
        sched = SchedulerOutput([ScheduledRequest(r, step.k + 1, [0] * step.k) for r, _ in live])
        engine.tracer.record(sched, applied.finished, occupancy,
                             sum(len(t) for _, t in applied.produced), time.perf_counter() - step.t0,
                             StepGraphInfo(self.target.graphs.mode, step.bucket,
                                           step.bucket - len(step.requests)),
                             spec_runs, step.propose_s, step.verify_s, scheduled_ahead=True)
        return applied.produced

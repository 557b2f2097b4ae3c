"""DraftChain: a draft model's speculative steps launched one after another on the device (async
scheduling of speculative decoding).

Owns when a speculative step may be launched before the host has read the previous one, and that
launch. It runs while the batch is steady: every running request decode-ready, nothing waiting for a
free seat (max_num_seqs), k >= 1 drafts for every request (no logits processors, logprobs or forks),
one graph bucket for the batch, and room for the worst case (blocks of both caches for every draft of
the steps in flight accepted; max_len not reached within them). Otherwise it launches nothing: the
engine reads the step in flight and its synchronous step takes over (that is how new requests are
admitted, preemption happens, and the tail of a request near max_tokens runs with fewer drafts).

A chained step is built on the device from the previous step's outputs: the acceptance update (how
many drafts passed, the next position, the last two verified tokens) is a handful of tensor ops on the
verify step's emitted runs, and it feeds the draft's first pass and the verify step's inputs directly,
so no host sync separates one step's verification from the next step's input preparation. The engine
reads and applies a chained step like any other (engine/engine.py; the counts moved on at launch, the
rejected drafts are rolled back when it is read); ``applied`` then keeps the draft cache's bookkeeping.

Every step's tokens are the synchronous engine's: the same graph steps run over the same inputs, the
draft's noise and the rejection sampler are keyed by (seed, position). The draft's first pass feeds each
request's last two verified tokens (one of them already in the draft cache unless every draft passed):
a uniform query of 2, so no per-request count has to be known on the host.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from minirunner.core.host_copy import to_device
from minirunner.engine.in_flight import InFlightStep
from minirunner.engine.request import Request
from minirunner.engine.scheduler import ScheduledRequest, ScheduledStep
from minirunner.spec_decode.async_utils import ChainState, sync_check
from minirunner.spec_decode.draft_model import draft_sampling_params, draw_drafts
from minirunner.spec_decode.proposer import DraftInput
from minirunner.worker.async_output import AsyncOutput
from minirunner.worker.cudagraph import GraphKey, GraphKind
from minirunner.worker.input_batch import graph_rows
from minirunner.worker.logits_processing import needs_logits_processing
from minirunner.worker.model_runner import ModelRunner
from minirunner.worker.runner_output import RunnerOutput, StepGraphInfo


class DraftChain:
    def __init__(self, spec, target: ModelRunner, kv, scheduler, device):
        self.spec, self.target, self.kv, self.scheduler = spec, target, kv, scheduler
        self.proposer = spec.proposer  # a DraftModelProposer
        self.draft: ModelRunner = self.proposer.runner
        self.device = torch.device(device)
        self.chain: dict[int, ChainState] = {}  # id(InFlightStep) -> its device state
        self._draft_params = None  # the segment's draft sampling parameters
        self._sampled = False  # does any request of the segment sample (else greedy drafts, one-hot q)
        self.num_launched = 0  # speculative steps launched by the chain

    @staticmethod
    def supports(runner: ModelRunner) -> bool:
        """A chain replays graph steps whose attention plans on the device (torch or triton backend)."""
        return runner.graphs is not None and runner.backend.supports_verify_graphs

    # -- the engine's entry ---------------------------------------------------------------------
    def launch(self, prev: InFlightStep | None, check_no_sync: bool = False) -> InFlightStep | None:
        """Launch the next speculative step if the batch allows: from the host's counts when nothing is
        in flight (``prev`` None), or on the device from ``prev``, a chained step not read yet. None:
        the batch does not allow it (the engine reads ``prev`` and steps synchronously).
        ``check_no_sync`` (CUDA): raise if preparing and launching the step waits for the device."""
        state = self.chain.pop(id(prev), None) if prev is not None else None
        plan = self._plan(state)
        if plan is None:
            return None
        k, bucket = plan
        batch = list(self.scheduler.running)
        if state is None:
            self._begin_segment(batch)
        with torch.inference_mode(), sync_check(check_no_sync, self.device):
            if state is None:
                start = to_device(np.asarray([r.num_computed_tokens for r in batch], np.int64), self.device)
                known = np.stack([r.token_buffer[r.num_computed_tokens - 1:r.num_computed_tokens + 1]
                                  for r in batch])
                pair = to_device(known.astype(np.int64), self.device)
                step = self._launch(batch, k, bucket, start, pair[:, 0], pair[:, 1])
            else:  # the acceptance update of ``prev``, on the device
                a = (state.runs >= 0).sum(dim=1, keepdim=True) - 1  # drafts accepted, per request
                start = state.start + a[:, 0] + 1  # the new last token's position
                before, last = state.ids.gather(1, a)[:, 0], state.runs.gather(1, a)[:, 0]
                step = self._launch(batch, k, bucket, start, before, last)
        self.scheduler.update_after_launch(step.sched)
        return step

    def applied(self, sched: ScheduledStep, runs: list[list[int]], end: bool) -> dict[str, list[int]]:
        """A chained step was read and applied (drafts rolled back): the draft cache holds each live
        request's verified tokens up to the last (all but the last two when every draft passed);
        full verified blocks join the prefix cache. ``end``: nothing chained follows — give back the
        blocks held for the worst case, hand the draft's sequences back to the synchronous proposer and
        return the drafts of the step that follows (the chain's own steps propose on the device)."""
        for s, run in zip(sched.scheduled, runs, strict=True):
            r = s.request
            if r.is_finished:
                continue
            all_passed = len(run) - 1 == len(s.draft_token_ids)
            self.proposer.set_computed(r.request_id, r.num_tokens - 1 - all_passed)
            self.kv.cache_full_blocks(r, r.num_tokens - 1)
        if end:
            for r in self.scheduler.running:
                self.kv.trim(r)
                seq = self.proposer.seqs.get(r.request_id)
                if seq is not None:
                    seq.tokens = list(r.all_token_ids)
                    seq.num_verified = len(seq.tokens)
            self.chain.clear()
            return self._drafts_after_segment()
        return {}

    def _drafts_after_segment(self) -> dict[str, list[int]]:
        """Drafts for the running requests whose tokens are all on the host, as the runner proposes
        after a step it ran itself."""
        running = self.scheduler.running
        k = self.spec.step_k(running, self.scheduler.may_join())
        if k == 0:
            return {}
        inputs, ks = [], []
        for r in running:
            n = min(k, r.max_len - r.num_tokens - 1)
            if n > 0 and r.decode_ready:
                inputs.append(DraftInput(r.request_id, r.all_token_ids, r.params, r.seed))
                ks.append(n)
        return self.target.drafter.propose_inputs(inputs, ks)

    # -- when a step may be launched ------------------------------------------------------------
    def _plan(self, state: ChainState | None) -> tuple[int, int] | None:
        """(k, bucket) of the next step if it may be launched now, with its blocks allocated; None
        otherwise. ``state``: the chained step in flight (the requests' counts include its worst case)."""
        running, scheduler = self.scheduler.running, self.scheduler
        waiting = scheduler.waiting and len(running) < scheduler.max_num_seqs
        if not running or waiting:
            return None  # the synchronous step admits what waits while there is a free seat
        if state is not None and running != state.requests:
            return None  # a request finished or was aborted
        k = self.spec.choose_k(len(running))
        if k < 1 or (state is not None and k != state.k):
            return None
        bucket = self.target.graphs.verify_bucket(len(running), k)
        if bucket is None or self.draft.graphs.bucket(len(running), 2) != bucket:
            return None
        for r in running:
            ahead = r.num_tokens + r.num_output_placeholders  # known tokens, and the worst case in flight
            if r.num_computed_tokens != ahead - 1 or r.num_computed_tokens < 1 or r.fork_children \
                    or needs_logits_processing(r) or r.params.logprobs is not None \
                    or r.params.prompt_logprobs is not None or ahead + k + 1 > r.max_len:
                return None
            if state is None and not self._draft_ready(r):
                return None
        for r in running:  # worst case: every draft of every step in flight accepted
            seq = self.proposer.seqs[r.request_id]
            end = r.num_computed_tokens + k + 1  # target positions written, + 1
            if not self.kv.allocate(r, k + 1) \
                    or not self.proposer.kv.allocate(seq, end - 1 - seq.num_computed_tokens):
                if state is None:  # give back what was taken (a chain in flight: its end does)
                    for other in running:
                        self.kv.trim(other)
                return None
        return k, bucket

    def _draft_ready(self, request: Request) -> bool:
        """Does the draft cache hold the request's verified tokens up to the last two (which the first
        draft pass feeds again)? True after a synchronous speculative step of this request."""
        seq = self.proposer.seqs.get(request.request_id)
        need = request.num_computed_tokens - 1
        return seq is not None and seq.num_computed_tokens >= need \
            and seq.tokens[:need] == request.all_token_ids[:need]

    def _begin_segment(self, batch: list[Request]) -> None:
        """A run of chained steps starts: the batch's draft sampling parameters, and the draft K/V each
        request is known to hold (its verified tokens before the last two)."""
        self._sampled = any(r.params.temperature > 0 for r in batch)
        self._draft_params = draft_sampling_params(batch, self.device, self.draft.model.config.vocab_size) \
            if self._sampled else None
        for r in batch:
            self.proposer.set_computed(r.request_id, r.num_computed_tokens - 1)

    # -- launching ------------------------------------------------------------------------------
    def _launch(self, batch: list[Request], k: int, bucket: int, start: torch.Tensor,
                before: torch.Tensor, last: torch.Tensor) -> InFlightStep:
        """Queue one speculative step on the device: k draft passes, then the verify replay. start,
        before, last: int64 [n] on the device, each request's last verified position and the tokens at
        start - 1 and start. Reads nothing back."""
        n, t0 = len(batch), time.perf_counter()
        self.kv.begin_step()
        copies = self.kv.take_copies()
        self.target.copy_blocks([c[0] for c in copies], [c[1] for c in copies])
        seqs = [self.proposer.seqs[r.request_id] for r in batch]
        self._stage_rows(self.draft, self._rows(self.draft, self.proposer.sent, seqs, self.proposer.kv),
                         bucket, sampling=False)
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
            # a copy: ``best`` lives in the graph's output memory, which the next pass's replay may reuse
            tokens.append(token.clone())
            step_ids, positions = token[:, None], (start + j + 1)[:, None]
        propose_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        # The verify step: the last verified token and the k drafts, at start .. start + k.
        ids = torch.cat((last[:, None], torch.stack(tokens, 1)), 1)
        target = self.target
        self._stage_rows(target, self._rows(target, self.scheduler.sent, batch, self.kv), bucket,
                         sampling=True)
        target.buffers.write_uniform(bucket, n, ids, start[:, None] + torch.arange(k + 1, device=self.device),
                                     sample_positions=start + 1)
        if self._sampled:
            target.graphs.write_draft_probs(torch.stack(qs, 1).reshape(n * k, -1))
        kind = GraphKind.VERIFY if self._sampled else GraphKind.VERIFY_ONEHOT
        runs, _ = target.graphs.run(GraphKey(bucket, kind, k + 1))
        runs = runs[:n].clone()  # the next replay overwrites the graph's outputs
        self.num_launched += 1
        # the host knows the step's shape, not its drafts: zeros stand for them
        sched = ScheduledStep([ScheduledRequest(r, k + 1, [0] * k) for r in batch])
        out = RunnerOutput(req_ids=[r.request_id for r in batch], num_drafts=[k] * n,
                           graph=StepGraphInfo(target.graphs.mode, bucket, bucket - n))
        step = InFlightStep(sched, AsyncOutput(out, runs), t0, propose_s, time.perf_counter() - t1,
                            ahead=True, chained=True)
        self.chain[id(step)] = ChainState(list(batch), k, start, ids, runs)
        return step

    @staticmethod
    def _rows(runner: ModelRunner, sent, seqs, kv) -> list[int]:
        """The state rows of ``seqs`` in ``runner``, their block ids brought up to date (as data)."""
        runner.update_states(sent.build([ScheduledRequest(s, 1) for s in seqs], kv.table))
        return [runner.state.row_of[s.request_id] for s in seqs]

    def _stage_rows(self, runner: ModelRunner, rows: list[int], bucket: int, sampling: bool) -> None:
        """The batch's block-table rows (and with ``sampling`` its sampling parameters), padded to the
        bucket, host to device without blocking, each through its own pinned copy (the buffers' mirror
        may still be read by a copy in flight)."""
        tables, params = graph_rows(runner.state, np.asarray(rows, dtype=np.int64), sampling)
        runner.buffers.put_graph_rows(tables, params, bucket, own_host=True)

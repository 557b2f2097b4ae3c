"""Drafter: the worker's side of speculative decoding — drafts proposed after sampling, their q kept
for the step that verifies them.

Owns the hand-off between a step's sampled runs and the proposer (n-gram or draft model, given to the
runner). After a uniform verify replay a draft model proposes on the device, from the step's device
outputs (spec_decode/draft_passes.py): nothing is read, the drafts stay in a device row the next step
gathers (``AsyncOutput.drafts``), and they come back as data when the step is read. Otherwise the step
is read and each sampling request's tokens are taken from the worker's own state row plus the run it
just emitted. Either way each request's k is capped by its ``max_len``, a request the step ends gets
none, and the drafts go back as data (``RunnerOutput.draft_token_ids``). It keeps each draft's q until
the next step gathers the scheduled ones. It never decides k (the scheduler's data says) and never
reads an engine object.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from minirunner.core.host_copy import to_device
from minirunner.core.sched.output import SchedulerOutput
from minirunner.kernels.rejection_sampling import one_hot_probs
from minirunner.spec_decode.proposer import DraftInput, Proposer
from minirunner.worker.async_output import AsyncOutput, DeviceDrafts, StepTimer
from minirunner.worker.runner_output import RunnerOutput
from minirunner.worker.states import CachedRequestState, RequestStateRows


@dataclass(eq=False)
class VerifyStep:
    """A uniform verify step replayed as ``bucket``: its emitted runs ([n, q] on the device) and, when it
    was built from drafts proposed on the device (``ahead``), its inputs there (``start`` [n], ``ids``
    [n, q]); None: the host's data holds them."""

    bucket: int
    runs: torch.Tensor
    start: torch.Tensor | None = None
    ids: torch.Tensor | None = None

    @property
    def ahead(self) -> bool:
        return self.start is not None


class Drafter:
    def __init__(self, proposer: Proposer, state: RequestStateRows, device: torch.device):
        self.proposer, self.state, self.device = proposer, state, device
        self.passes = getattr(proposer, "device_passes", None)  # a draft model's passes on the device
        self.probs: dict[str, torch.Tensor] = {}  # request id -> q of its last drafts

    @property
    def has_q(self) -> bool:
        """Whether drafts may come with the draft model's q (a draft model), not one-hot (n-gram)."""
        return self.passes is not None

    def propose(self, sched: SchedulerOutput, result: AsyncOutput, verify: VerifyStep | None) -> None:
        """Propose ``sched.num_spec_tokens`` drafts after the step ``result`` sampled: on the device after
        a verify replay when the draft model can (``result.drafts``; nothing is read), else from the
        tokens read (:meth:`propose_read`). A step built ahead whose drafts cannot be proposed on the
        device proposes none (its tokens are not on the host)."""
        if verify is not None and self.passes is not None and self._propose_on_device(sched, result, verify):
            return
        if verify is None or not verify.ahead:
            self.propose_read(sched, result.get_output())

    def _propose_on_device(self, sched: SchedulerOutput, result: AsyncOutput, verify: VerifyStep) -> bool:
        k, state = sched.num_spec_tokens, self.state
        rids = list(sched.num_scheduled_tokens)
        rows = [state.requests[state.row_of[rid]] for rid in rids]
        computed = sched.num_computed_tokens()
        starts = [computed[rid] for rid in rids]
        drafts = [sched.scheduled_spec_decode_tokens.get(rid, []) for rid in rids]
        if not self.passes.ready(rids, starts, drafts, verify.bucket, k, verify.ahead):
            return False
        start, ids = verify.start, verify.ids
        if start is None:  # the verify step's inputs, from the host's data (staged copies)
            start = to_device(np.asarray(starts, dtype=np.int64), self.device)
            known = [r.token_ids[s:s + len(d) + 1] for r, s, d in zip(rows, starts, drafts, strict=True)]
            ids = to_device(np.stack(known), self.device)
        timer = StepTimer(self.device)
        requests = [DraftInput(r.req_id, (), r.params, r.seed) for r in rows]
        capacity = [s + n + k for s, n in zip(starts, sched.num_scheduled_tokens.values(), strict=True)]
        device_drafts = self.passes.launch(requests, k, verify.bucket, start, ids, verify.runs, capacity)
        if device_drafts is None:
            return False
        timer.stop()
        result.drafts = device_drafts
        result.add_read(partial(self._read_device, device_drafts, self.passes.num_launches, timer),
                        device_drafts.start, device_drafts.tokens)
        return True

    def _read_device(self, drafts: DeviceDrafts, launch: int, timer: StepTimer, out: RunnerOutput,
                     start: torch.Tensor, tokens: torch.Tensor) -> None:
        """The step was read: its runs go to the worker's rows, its device drafts (capped, none for a
        request the step ended) to ``out.draft_token_ids``, their q kept, the draft's shadows updated."""
        state, runs, k = self.state, dict(zip(out.req_ids, out.runs, strict=True)), drafts.k
        tokens, verified = tokens.tolist(), {}
        for i, (rid, last) in enumerate(zip(drafts.req_ids, start.tolist(), strict=True)):
            index = state.row_of.get(rid)
            if index is None:  # finished or aborted since
                continue
            row, run = state.requests[index], runs[rid]
            row.write_tokens(last + 1 - len(run), np.asarray(run, dtype=np.int64), [])
            if ends_request(row, row.num_tokens, run):
                self.free(rid)
                continue
            verified[rid] = row.token_ids[:row.num_tokens].tolist()
            n = min(k, row.max_len - row.num_tokens - 1)
            if n > 0:
                out.draft_token_ids[rid] = tokens[i][:n]
            if drafts.q is not None:
                self.probs[rid] = drafts.q.view(len(drafts.req_ids), k, -1)[i]
            else:
                self.probs.pop(rid, None)
        self.passes.read(drafts, launch, verified, tokens)
        out.propose_s = timer.seconds()

    def propose_read(self, sched: SchedulerOutput, out: RunnerOutput) -> None:
        """Draft up to ``sched.num_spec_tokens`` tokens for every request that sampled in this step
        (``out.runs`` read), and for every prefill chunk that ended one token short of its request's
        known tokens (the next step feeds that token with the drafts), into ``out.draft_token_ids``;
        ``out.propose_s`` the host time it took. A request the step ends (length, EOS, a stop token id)
        gets none, and its proposer state is freed first (a draft model's pool may be short)."""
        t0 = time.perf_counter()
        state, k = self.state, sched.num_spec_tokens
        runs = dict(zip(out.req_ids, out.runs, strict=True))
        inputs, ks = [], []
        for rid in sched.num_scheduled_tokens:  # batch order
            if rid in sched.in_flight_req_ids:  # its last token before the run is not on the host
                continue
            row, run = state.requests[state.row_of[rid]], runs.get(rid)
            if run is None:  # a prefill chunk: drafts only when one known token is left to feed
                if row.num_tokens != row.num_known - 1:
                    continue
                tokens = row.token_ids[:row.num_known]
            else:
                tokens = np.concatenate([row.token_ids[:row.num_tokens], np.asarray(run, dtype=np.int64)])
                if ends_request(row, len(tokens), run):
                    self.proposer.free(rid)
                    continue
            # a step emits up to k + 1 tokens: never past max_len (prompt + max_tokens, max_model_len)
            n = min(k, row.max_len - len(tokens) - 1)
            if n > 0:
                inputs.append(DraftInput(rid, tokens, row.params, row.seed))
                ks.append(n)
        out.draft_token_ids = self.propose_inputs(inputs, ks)
        out.propose_s = time.perf_counter() - t0

    def propose_inputs(self, inputs: list[DraftInput], ks: list[int]) -> dict[str, list[int]]:
        """Draft ks[i] tokens for inputs[i]: request id -> its drafts (their q kept, the last kept
        forgotten)."""
        self.probs.clear()
        drafts = {}
        if inputs:
            for rid, (tokens, q) in self.proposer.propose(inputs, ks).items():
                drafts[rid] = tokens
                if q is not None:
                    self.probs[rid] = q
        return drafts

    def draft_probs(self, sched: SchedulerOutput) -> torch.Tensor | None:
        """q of every draft token this step verifies, in batch order ([num_draft_tokens, vocab]), or
        None (every draft one-hot: n-gram, or greedy draft passes)."""
        if not self.probs:
            return None
        like = next(iter(self.probs.values()))
        rows = []
        for rid in sched.num_scheduled_tokens:
            drafts = sched.scheduled_spec_decode_tokens.get(rid)
            if not drafts or rid not in sched.sampling_req_ids:
                continue
            q = self.probs.get(rid)
            if q is None:  # this request's drafts were greedy: one-hot rows
                q = one_hot_probs(to_device(np.asarray(drafts, dtype=np.int64), like.device), like.shape[-1])
            rows.append(q[:len(drafts)])
        return torch.cat(rows) if rows else None

    def free(self, request_id: str) -> None:
        """Forget a finished or aborted request's draft state."""
        self.probs.pop(request_id, None)
        self.proposer.free(request_id)
        if self.passes is not None:
            self.passes.free(request_id)


def ends_request(row: CachedRequestState, num_tokens: int, run: list[int]) -> bool:
    """Does ``run`` (the step's emitted tokens, ``num_tokens`` the request's tokens with them) end the
    request by length, EOS or a stop token id? (The stop checks the worker can make; stop strings are
    found by the engine's detokenizer.)"""
    if num_tokens >= row.max_len:
        return True
    before = num_tokens - len(run) - row.num_prompt_tokens  # outputs before the run
    return any(row.params.stops_on(t, before + j + 1, row.eos_token_ids) for j, t in enumerate(run))

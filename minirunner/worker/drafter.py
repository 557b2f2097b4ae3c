"""Drafter: the worker's side of speculative decoding — drafts proposed after sampling, their q kept
for the step that verifies them.

Owns the hand-off between a step's sampled tokens and the proposer given to the runner. A draft model
(spec_decode/draft_model.py) runs after every step, inside ``execute``
(spec_decode/draft_passes.py): after a graph step its passes stay on the device (nothing is read; the
drafts also go in ``AsyncOutput.drafts`` for a step launched before this one is read); after an eager
step the step is read first. A host proposer (n-gram) reads the step and drafts from each request's
tokens: its worker state row plus the run it just emitted. Either way each request's k is capped by its
``max_len``, a request the step ends gets none, and the drafts go back as data
(``RunnerOutput.draft_token_ids``). It keeps each draft's q until the next step gathers the scheduled
ones. It never decides k (the scheduler's data says) and never reads an engine object.
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
from minirunner.spec_decode.draft_passes import DraftPasses
from minirunner.spec_decode.proposer import DraftInput, Proposer
from minirunner.worker.async_output import AsyncOutput, DeviceDrafts, StepTimer
from minirunner.worker.runner_output import RunnerOutput
from minirunner.worker.states import CachedRequestState, RequestStateRows


@dataclass(eq=False)
class LaunchedStep:
    """What the drafter proposes from: the step's graph ``bucket`` (None: it ran eager), its query
    length per row (a graph step's), and its sampled tokens on the device ([n] one each, or emitted
    runs [n, q], -1 after each ends; None: nothing sampled). ``ahead``: it was launched before the
    step that proposed its drafts was read (its tokens are on the device only)."""

    bucket: int | None
    query_len: int
    sampled: torch.Tensor | None
    ahead: bool = False


EAGER_STEP = LaunchedStep(None, 1, None)  # an eager step: the drafter reads its output


class Drafter:
    def __init__(self, proposer: Proposer, state: RequestStateRows, device: torch.device, buffers=None):
        self.proposer, self.state, self.device = proposer, state, device
        self.passes = None
        if getattr(proposer, "proposes_on_device", False):  # a draft model, over the target's buffers
            proposer.attach(buffers)
            self.passes = DraftPasses(proposer, buffers, state)
        self.probs: dict[str, torch.Tensor] = {}  # request id -> q of its last drafts

    @property
    def has_q(self) -> bool:
        """Whether drafts may come with the draft model's q (a draft model), not one-hot (n-gram)."""
        return self.passes is not None

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        """The draft's KV cache tensors (indexed by the target's block ids), if any."""
        return [] if self.passes is None else self.proposer.kv_caches

    def propose(self, sched: SchedulerOutput, result: AsyncOutput, step: LaunchedStep) -> None:
        """Propose ``sched.num_spec_tokens`` drafts after the step ``result`` sampled. A draft model
        runs after every step, k = 0 included (its cache keeps step with the target's); a host
        proposer reads the step (:meth:`propose_read`), unless it was launched ahead (its tokens are not
        on the host) or asks for no drafts."""
        if self.passes is None:
            if sched.num_spec_tokens and not step.ahead:
                self.propose_read(sched, result.get_output())
            return
        timer, k = StepTimer(self.device), sched.num_spec_tokens
        rids = list(sched.num_scheduled_tokens)
        rows = np.asarray([self.state.row_of[r] for r in rids], dtype=np.int64)
        requests = [self.state.requests[i] for i in rows]
        n, q = len(rids), step.query_len
        if step.bucket is not None and self.passes.graph_fits(step.bucket, n, q, k):
            upper = max(sched.num_computed_tokens().values()) + q + k
            drafts = self.passes.after_graph_step(step.bucket, q, step.sampled, requests, rows, k, upper)
            if drafts is not None and self.passes.graph_fits(step.bucket, n, k + 1, k):
                result.drafts = drafts  # a verify step of them may run before this step is read
        elif step.ahead:
            raise RuntimeError("a step launched ahead ran as a graph step, and so must the draft's passes "
                               "after it; this is a bug: please report it")
        else:
            drafts = self._after_eager(sched, result, rows, k)
        timer.stop()
        if drafts is not None:
            result.add_read(partial(self._read_device, drafts, timer), drafts.start, drafts.tokens)

    def _after_eager(self, sched: SchedulerOutput, result: AsyncOutput, rows: np.ndarray, k: int):
        """The draft's passes after an eager step: each request feeds its query's tokens up to its last
        accepted one, and a request that goes on drafting the token it sampled. The step is read first
        when that needs its runs (drafts to propose, or drafts verified)."""
        runs = {}
        if k > 0 or sched.scheduled_spec_decode_tokens:
            out = result.get_output()
            runs = dict(zip(out.req_ids, out.runs, strict=True))
        computed, feeds, requests, t = sched.num_computed_tokens(), [], [], 0
        for rid, row in zip(sched.num_scheduled_tokens, rows, strict=True):
            n, start, run = sched.num_scheduled_tokens[rid], computed[rid], runs.get(rid)
            drafts = sched.scheduled_spec_decode_tokens.get(rid, ())
            keep = n if run is None else n - len(drafts) + len(run) - 1  # known tokens, accepted drafts
            state, sampled = self.state.requests[row], None
            # it drafts unless the run ends it or no draft fits under its max_len
            if run is not None and k > 0 and not ends_request(state, start + keep + 1, run) \
                    and start + keep + 1 < state.max_len - 1:
                sampled = run[-1]
                requests.append(state)
            feeds.append((row, start, t, keep, sampled))
            t += n
        query = self.passes.buffers.input_ids[:sched.total_num_scheduled_tokens]
        return self.passes.after_eager_step(query, feeds, requests, k)

    def _read_device(self, drafts: DeviceDrafts, timer: StepTimer, out: RunnerOutput,
                     start: torch.Tensor, tokens: torch.Tensor) -> None:
        """The step was read: its runs go to the worker's rows, its device drafts (capped, none for a
        request the step ended) to ``out.draft_token_ids``, their q kept."""
        state, runs, k = self.state, dict(zip(out.req_ids, out.runs, strict=True)), drafts.k
        tokens = tokens.tolist()
        for i, (rid, last) in enumerate(zip(drafts.req_ids, start.tolist(), strict=True)):
            index = state.row_of.get(rid)
            if index is None:  # finished or aborted since
                continue
            row, run = state.requests[index], runs[rid]
            row.write_tokens(last + 1 - len(run), np.asarray(run, dtype=np.int64), [])
            n = min(k, row.max_len - row.num_tokens - 1)
            if ends_request(row, row.num_tokens, run) or n <= 0:
                self.probs.pop(rid, None)
                continue
            out.draft_token_ids[rid] = tokens[i][:n]
            if drafts.q is not None:
                self.probs[rid] = drafts.q.view(len(drafts.req_ids), k, -1)[i]
            else:
                self.probs.pop(rid, None)
        out.propose_s = timer.seconds()

    def propose_read(self, sched: SchedulerOutput, out: RunnerOutput) -> None:
        """Draft up to ``sched.num_spec_tokens`` tokens for every request that sampled in this step
        (``out.runs`` read), and for every prefill chunk that ended one token short of its request's
        known tokens (the next step feeds that token with the drafts), into ``out.draft_token_ids``;
        ``out.propose_s`` the host time it took. A request the step ends (length, EOS, a stop token id)
        gets none."""
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
                    continue
            # a step emits up to k + 1 tokens: never past max_len (prompt + max_tokens, max_model_len)
            n = min(k, row.max_len - len(tokens) - 1)
            if n > 0:
                inputs.append(DraftInput(rid, tokens, row.params, row.seed))
                ks.append(n)
        out.draft_token_ids = self.propose_inputs(inputs, ks)
        out.propose_s = time.perf_counter() - t0

    def propose_inputs(self, inputs: list[DraftInput], ks: list[int]) -> dict[str, list[int]]:
        """Draft ks[i] tokens for inputs[i] with a host proposer: request id -> its drafts (their q
        kept, the last kept forgotten)."""
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
        """Forget a finished, aborted or preempted request's draft state (its rows go with the
        worker's)."""
        self.probs.pop(request_id, None)
        self.proposer.free(request_id)


def ends_request(row: CachedRequestState, num_tokens: int, run: list[int]) -> bool:
    """Does ``run`` (the step's emitted tokens, ``num_tokens`` the request's tokens with them) end the
    request by length, EOS or a stop token id? (The stop checks the worker can make; stop strings are
    found by the engine's detokenizer.)"""
    if num_tokens >= row.max_len:
        return True
    before = num_tokens - len(run) - row.num_prompt_tokens  # outputs before the run
    return any(row.params.stops_on(t, before + j + 1, row.eos_token_ids) for j, t in enumerate(run))

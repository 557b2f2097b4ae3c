"""Drafter: the worker's side of speculative decoding — drafts proposed after sampling, their q kept
for the step that verifies them.

Owns the hand-off between a step's sampled runs and the proposer (n-gram or draft model, given to the
runner): each sampling request's tokens are read from the worker's own state row plus the run it just
emitted, its k capped by its ``max_len``, and the drafts go back as data (``RunnerOutput``). It keeps
each draft's q until the next step gathers the scheduled ones. It never decides k (the scheduler's data
says) and never reads an engine object.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from minirunner.core.host_copy import to_device
from minirunner.core.sched.output import SchedulerOutput
from minirunner.kernels.rejection_sampling import one_hot_probs
from minirunner.spec_decode.proposer import DraftInput, Proposer
from minirunner.worker.runner_output import RunnerOutput
from minirunner.worker.states import CachedRequestState, RequestStateRows


class Drafter:
    def __init__(self, proposer: Proposer, state: RequestStateRows):
        self.proposer, self.state = proposer, state
        self.probs: dict[str, torch.Tensor] = {}  # request id -> q of its last drafts

    def propose(self, sched: SchedulerOutput, out: RunnerOutput) -> None:
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


def ends_request(row: CachedRequestState, num_tokens: int, run: list[int]) -> bool:
    """Does ``run`` (the step's emitted tokens, ``num_tokens`` the request's tokens with them) end the
    request by length, EOS or a stop token id? (The stop checks the worker can make; stop strings are
    found by the engine's detokenizer.)"""
    if num_tokens >= row.max_len:
        return True
    before = num_tokens - len(run) - row.num_prompt_tokens  # outputs before the run
    return any(row.params.stops_on(t, before + j + 1, row.eos_token_ids) for j, t in enumerate(run))

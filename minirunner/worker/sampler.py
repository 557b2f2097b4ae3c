"""The sampler: logits processors, then greedy / seeded sampling (the Triton kernel or its twin, chosen
once), the sampled tokens' logprobs, and the verify stage of a speculative step (the rejection sampler,
spec_decode/rejection_sampler.py, whose one instance the graph verify step shares).

Owns the per-request logits-processor state (worker/logits_processing.py), which kind of compiled sampler
a graph step needs, and the per-row step after a replay: rows whose request needs the logits processors
are sampled again from their processed logits, and a verify replay's rows with fewer drafts verified over
their own (so one request's options cost its row only). It reads the
sampling parameters from the persistent state rows (worker/states.py); it never runs the model and never
writes a step buffer.
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.core.host_copy import to_device
from minirunner.kernels._triton import use_triton
from minirunner.kernels.sampling import sample, sample_ref
from minirunner.logprobs import TokenLogprobs, score_tokens
from minirunner.spec_decode.rejection_sampler import RejectionSampler
from minirunner.structured_output.bitmask import apply_grammar_bitmasks
from minirunner.worker.cudagraph import GraphKind
from minirunner.worker.input_batch import InputBatch
from minirunner.worker.logits_processing import (
    LogitsProcessors,
    apply_logits_processors,
    needs_logits_processing,
    needs_logits_processors,
)
from minirunner.worker.states import CachedRequestState, RequestStateRows


class Sampler:
    def __init__(self, state: RequestStateRows, vocab_size: int, device: torch.device):
        self.state, self.vocab_size = state, vocab_size
        self.logits_processors = LogitsProcessors(vocab_size, device)
        self._kernel = sample if use_triton(device) else sample_ref
        self.rejection_sampler = RejectionSampler(device)

    def sample(self, logits: torch.Tensor, rows: np.ndarray, requests: list[CachedRequestState],
               positions: torch.Tensor) -> torch.Tensor:
        """One token per sampling request: int64 [num_sampling]. logits: fp32 [num_sampling, vocab];
        rows: their state rows; positions: int64 [num_sampling], each token's position (the seeded
        noise is keyed by it). A structured-output request's grammar bitmask, then logit bias,
        min_tokens, penalties and min_p apply first (only when some request asks for them); an
        all-greedy batch is then one argmax, and the top-k/top-p sort runs only when some request in
        the batch asks for it."""
        logits = apply_grammar_bitmasks(logits, requests)
        logits = apply_logits_processors(logits, self.logits_processors.prepare(requests))
        state = self.state
        temps = state.temperature[rows]
        if not temps.any():
            tokens = logits.argmax(dim=-1)
        else:
            top_k, top_p = state.top_k[rows], state.top_p[rows]
            filters = bool(((top_k > 0) & (top_k < logits.shape[-1])).any() or (top_p < 1).any())
            dev = logits.device  # staged, pinned copies: the host never waits for the device here
            tokens = self._kernel(logits, to_device(temps, dev), to_device(top_k, dev), to_device(top_p, dev),
                                  to_device(state.seed[rows], dev), positions, apply_filters=filters)
        self.logits_processors.record(tokens)
        return tokens

    def verify(self, logits: torch.Tensor, rows: np.ndarray, draft_token_ids: np.ndarray,
               num_drafts: np.ndarray, positions: torch.Tensor,
               draft_probs: torch.Tensor | None) -> torch.Tensor:
        """Each sampling request's emitted run (its accepted drafts, then the target's own token) of an
        eager speculative step, on the device: int64 [num_sampling, max drafts + 1], -1 after each run
        ends. logits: fp32 [num_drafts + num_sampling, vocab], each request's last
        known token's row then one per draft; rows: their state rows (the sampling parameters);
        draft_token_ids: int64 [num_draft_tokens]; num_drafts: int64 [num_sampling]; positions: int64
        [num_sampling], each first sampled position; draft_probs: fp32 [num_draft_tokens, vocab], or
        None for one-hot (n-gram) drafts."""
        state, dev = self.state, logits.device
        temps = state.temperature[rows]
        logits = apply_grammar_bitmasks(logits, [state.requests[r] for r in rows], num_drafts)

        def put(arr: np.ndarray) -> torch.Tensor:
            return to_device(arr, dev)

        return self.rejection_sampler(put(draft_token_ids), put(np.cumsum(num_drafts)), draft_probs, logits,
                                      put(temps), put(state.top_k[rows]), put(state.top_p[rows]),
                                      put(state.seed[rows]), positions, all_greedy=not temps.any(),
                                      max_k=int(num_drafts.max(initial=0)))

    def graph_kind(self, rows: np.ndarray) -> GraphKind:
        """Which compiled sampler a graph step of these state rows needs: GREEDY, SAMPLE or FILTER."""
        state = self.state
        if not state.temperature[rows].any():
            return GraphKind.GREEDY
        top_k = state.top_k[rows]
        if ((top_k > 0) & (top_k < self.vocab_size)).any() or (state.top_p[rows] < 1).any():
            return GraphKind.FILTER
        return GraphKind.SAMPLE

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                 requests: list[CachedRequestState]) -> TokenLogprobs | None:
        """The sampled tokens' logprobs (raw logits), with as many alternatives as any request asks for;
        None when none asks."""
        k = max((r.params.logprobs for r in requests if r.params.logprobs is not None), default=None)
        return None if k is None else score_tokens(logits, tokens, k)


    # -- the per-row step after a replay or a verify pass -----------------------------------------
    def resample_processed(self, sampled: torch.Tensor, logits: torch.Tensor, first: np.ndarray,
                           inputs: InputBatch) -> None:
        """Rows whose request needs the logits processors (bias, pending min_tokens, penalties, min_p,
        bad words, allowed ids) draw their token again, here, after the forward, from their processed
        logits: the compiled or captured step sampled every row with temperature / top-k / top-p only,
        and a verify step gave these requests no drafts. The one per-row point a further mask (e.g. a
        grammar's) joins. ``sampled``: tokens int64 [n] or runs int64 [n, w] on the device, changed in
        place (a run becomes the one token); ``first``: each request's first logits row."""
        rows, requests, positions = inputs.sample_rows, inputs.sample_states, inputs.sample_positions
        # a decode row with a grammar takes its bitmask here too; a verify row's is applied by the
        # rejection pass over its own drafts (verify, verify_short_rows)
        needs = needs_logits_processing if sampled.dim() == 1 else needs_logits_processors
        index = [i for i, r in enumerate(requests) if needs(r)]
        if not index:
            return
        dev = logits.device
        idx = to_device(np.asarray(index, dtype=np.int64), dev)
        tokens = self.sample(logits[to_device(first[index].astype(np.int64), dev)], rows[index],
                             [requests[i] for i in index], positions[idx])
        if sampled.dim() == 1:
            sampled.index_copy_(0, idx, tokens)
        else:
            sampled.index_fill_(0, idx, -1)
            sampled[:, 0].index_copy_(0, idx, tokens)

    def verify_short_rows(self, runs: torch.Tensor, logits: torch.Tensor, k: int, inputs: InputBatch) -> None:
        """A uniform verify replay (k + 1 logits rows per request) whose requests with fewer than k
        drafts were padded inside their row, or whose grammar masks their rows: their runs come from the
        rejection sampler over their own drafts, after the forward (one-hot q: only n-gram drafts are
        ragged or replayed with a grammar). ``runs`` int64 [n, k + 1]
        on the device, changed in place; rows that need the logits processors are left to
        :meth:`resample_processed`."""
        rows, requests, positions = inputs.sample_rows, inputs.sample_states, inputs.sample_positions
        draft_token_ids, num_drafts = inputs.draft_token_ids, inputs.num_drafts
        short = [i for i, (d, r) in enumerate(zip(num_drafts, requests, strict=True))
                 if (d < k or r.grammar_bitmask is not None) and not needs_logits_processors(r)]
        if not short:
            return
        ends = np.cumsum(num_drafts)
        drafts = np.concatenate([draft_token_ids[ends[i] - num_drafts[i]:ends[i]] for i in short])
        d = num_drafts[short]
        logit_rows = np.concatenate([i * (k + 1) + np.arange(num_drafts[i] + 1) for i in short])
        dev = logits.device
        idx = to_device(np.asarray(short, dtype=np.int64), dev)
        sub = self.verify(logits[to_device(logit_rows, dev)], rows[short], drafts, d, positions[idx], None)
        runs.index_fill_(0, idx, -1)
        runs[:, :sub.shape[1]].index_copy_(0, idx, sub)

"""Speculator: the engine's side of speculative decoding — drafts before a step, bookkeeping after it.

Owns choosing k for each step (fixed, by batch-size table, or acceptance-driven; 0 while a request that
runs or may join the step needs the host-side logits processors or logprobs), asking the proposer for
drafts of every decode-ready running request (fewer near max_tokens / max_model_len), handing the
draft probabilities to the verify step, and the metrics (per request, engine-wide, per step). Never
runs the target model, never appends tokens and never touches the target's KV cache (the engine rolls
back num_computed_tokens through the scheduler; the draft proposer rolls back its own cache).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from minirunner.core.host_copy import to_device
from minirunner.engine.request import Request
from minirunner.engine.scheduler import ScheduledRequest
from minirunner.kernels.rejection_sampling import one_hot_probs
from minirunner.spec_decode.config import SpeculativeConfig
from minirunner.spec_decode.draft_model import DraftModelProposer
from minirunner.spec_decode.dynamic import AcceptanceDrivenK
from minirunner.spec_decode.metrics import SpecStats
from minirunner.spec_decode.ngram import NgramProposer
from minirunner.worker.logits_processing import needs_logits_processing


class Speculator:
    def __init__(self, config: SpeculativeConfig, engine_config, num_blocks: int):
        self.config = config
        if config.method == "draft_model":
            self.proposer = DraftModelProposer(config.model, engine_config, num_blocks)
        else:
            self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.dynamic = AcceptanceDrivenK(config.num_speculative_tokens, config.cost_ratio) \
            if config.dynamic_k == "acceptance" else None
        self.stats = SpecStats()
        self._probs: dict[str, torch.Tensor] = {}

    def reset_stats(self) -> None:
        """Start the engine-wide metrics afresh (a benchmark measures one run)."""
        self.stats = SpecStats()

    def choose_k(self, batch_size: int) -> int:
        """The k the next proposing step would use (pure: asking changes nothing)."""
        if self.dynamic is not None:
            return self.dynamic.choose(self.stats)
        return self.config.k_for_batch_size(batch_size)

    def propose(self, running: list[Request], live_ids: set[str], joining: list[Request] = ()) -> float:
        """Set ``spec_token_ids`` on every running request (empty unless it is decode-ready).
        ``joining``: the waiting requests the coming step may admit (they sample in its verify pass).
        Returns the seconds it took (host time)."""
        t0 = time.perf_counter()
        self.proposer.release(live_ids)
        self._probs.clear()
        ready = []
        for r in running:
            r.spec_token_ids = []
            if r.num_computed_tokens == r.num_tokens - 1:
                ready.append(r)
        # The rejection sampler knows temperature, top-k and top-p only: while any request of the step
        # needs the host-side logits processors (bias, pending min_tokens, penalties, min_p) or sampled
        # logprobs, the step runs without drafts (the plain sampler applies them to every row). That
        # includes a request admitted into the step: it samples its first token in the same pass.
        if any(needs_plain_sampling(r) for r in running) or any(needs_plain_sampling(r) for r in joining):
            ready = []
        k = self.choose_k(len(running)) if ready else 0
        if ready and self.dynamic is not None:
            self.dynamic.advance()
        # A step emits up to k + 1 tokens: never past max_len (prompt + max_tokens, max_model_len).
        ks = [max(0, min(k, r.max_len - r.num_tokens - 1)) for r in ready]
        if any(ks):
            for rid, (tokens, probs) in self.proposer.propose(ready, ks).items():
                request = next(r for r in ready if r.request_id == rid)
                request.spec_token_ids = tokens
                if probs is not None:
                    self._probs[rid] = probs
        return time.perf_counter() - t0

    def draft_probs(self, scheduled: list[ScheduledRequest]) -> torch.Tensor | None:
        """q of every draft token of this step, in order ([num_draft_tokens, vocab]), or None."""
        if not self._probs:
            return None  # every draft one-hot (n-gram, or greedy draft passes)
        rows = []
        for s in scheduled:
            if not (s.samples and s.draft_token_ids):
                continue
            q = self._probs.get(s.request.request_id)
            if q is None:  # this request's drafts were greedy: one-hot rows
                like = next(iter(self._probs.values()))
                q = one_hot_probs(to_device(np.asarray(s.draft_token_ids, dtype=np.int64), like.device),
                                  like.shape[-1])
            rows.append(q[:len(s.draft_token_ids)])
        return torch.cat(rows) if rows else None

    def verified(self, sampling: list[ScheduledRequest], runs: list[list[int]], kv, propose_s: float,
                 verify_s: float, trim: bool = True) -> dict[str, list[int]]:
        """After a verify step was applied and the scheduler rolled back each request's rejected drafts
        (``Scheduler.update_from_output``): count what was accepted. ``trim``: give back the blocks that
        held only rejected drafts (``kv``) — not while a chained step in flight may still write them.
        Returns {request_id: [k, accepted]} for the trace."""
        for s in sampling:
            if s.draft_token_ids and trim:
                kv.trim(s.request)
        return self.record_runs([s.request for s in sampling], [len(s.draft_token_ids) for s in sampling],
                                runs, propose_s, verify_s)

    def record_runs(self, requests: list[Request], ks: list[int], runs: list[list[int]],
                    propose_s: float, verify_s: float) -> dict[str, list[int]]:
        """:meth:`record` for requests[i] having verified ks[i] drafts into runs[i]."""
        per_step = {}
        for request, k, run in zip(requests, ks, runs, strict=True):
            if not k:
                continue
            accepted = len(run) - 1
            per_step[request.request_id] = [k, accepted]
            self.stats.record(k, accepted)
            if request.spec_stats is None:
                request.spec_stats = SpecStats()
            request.spec_stats.record(k, accepted)
        if per_step:
            self.stats.propose_s += propose_s
            self.stats.verify_s += verify_s
            if self.dynamic is not None:
                self.dynamic.observe(propose_s, max(k for k, _ in per_step.values()), verify_s)
        return per_step


def needs_plain_sampling(request: Request) -> bool:
    """Does the request need what only the plain sampler does (logits processors, sampled logprobs)?"""
    return needs_logits_processing(request) or request.params.logprobs is not None

"""Speculator: the engine's side of speculative decoding — how many drafts, and the bookkeeping after.

Owns choosing k for each step (fixed, by batch-size table, or acceptance-driven), the gate that drops the
drafts of a request that needs the logits processors or logprobs (it is verified with k = 0 in the same
step as the others), and the metrics (per request, engine-wide, per step). The
drafts themselves are proposed by the worker after sampling (worker/drafter.py, with the proposer
engine/build.py gives the runner) and
reach the scheduler as data (``Scheduler.update_draft_token_ids``). Never runs a model, never appends
tokens and never touches the target's KV cache (the scheduler rolls back num_computed_tokens).
"""

from __future__ import annotations

from minirunner.spec_decode.config import SpeculativeConfig
from minirunner.spec_decode.dynamic import AcceptanceDrivenK
from minirunner.spec_decode.metrics import SpecStats
from minirunner.worker.logits_processing import needs_logits_processors
from minirunner.worker.runner_output import RunnerOutput


class Speculator:
    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self.dynamic = AcceptanceDrivenK(config.num_speculative_tokens, config.cost_ratio) \
            if config.dynamic_k == "acceptance" else None
        self.stats = SpecStats()
        self.propose_s = 0.0  # host time the worker took to propose the drafts now scheduled

    def reset_stats(self) -> None:
        """Start the engine-wide metrics afresh (a benchmark measures one run)."""
        self.stats = SpecStats()

    def choose_k(self, batch_size: int) -> int:
        """The k the next proposing step would use (pure: asking changes nothing)."""
        if self.dynamic is not None:
            return self.dynamic.choose(self.stats)
        return self.config.k_for_batch_size(batch_size)

    def step_k(self, running: list) -> int:
        """The k a step of ``running`` proposes (pure: :meth:`choose_k`'s)."""
        return self.choose_k(len(running))

    def plan(self, running: list) -> int:
        """Before a step is scheduled: the k its worker proposes after sampling (for the next step).

        The rejection sampler knows temperature, top-k and top-p only: a request that needs the
        logits processors (bias, pending min_tokens, penalties, min_p, bad words) or sampled logprobs
        is verified with k = 0 (its drafts are dropped here; the sampler after the forward applies its
        options to its row), while the others keep theirs, cut to this step's k."""
        k = self.step_k(running)
        for r in running:  # proposed for the batch of the step before: at most this step's k
            if needs_plain_sampling(r):
                r.spec_token_ids = []
            elif len(r.spec_token_ids) > k:
                r.spec_token_ids = r.spec_token_ids[:k]
        if k and self.dynamic is not None:
            self.dynamic.advance()
        return k

    def take_drafts(self, out: RunnerOutput) -> dict[str, list[int]]:
        """A step's output was read: its drafts (for the scheduler), their proposing time kept for the
        step that verifies them (``propose_s``)."""
        self.propose_s = out.propose_s
        return out.draft_token_ids

    def verified(self, sampling: list, runs: list[list[int]], kv, propose_s: float,
                 verify_s: float, plain_decode: bool = False) -> dict[str, list[int]]:
        """After a verify step was applied and the scheduler rolled back each request's rejected drafts
        (``Scheduler.update_from_output``): count what was accepted and give back the blocks past each
        request's computed tokens (``kv``; a step in flight counts its worst case there, so the blocks
        it may write stay). ``plain_decode``: the step decoded one token per request without drafts; its
        time is the plain step the acceptance-driven k measures c and v against. Returns
        {request_id: [k, accepted]} for the trace."""
        for s in sampling:
            if s.draft_token_ids:
                kv.trim(s.request)
        if plain_decode and self.dynamic is not None:
            self.dynamic.observe_plain(verify_s)
        return self.record_runs([s.request for s in sampling], [len(s.draft_token_ids) for s in sampling],
                                runs, propose_s, verify_s)

    def record_runs(self, requests: list, ks: list[int], runs: list[list[int]],
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


def needs_plain_sampling(request) -> bool:
    """Does the request need what only the plain sampler does (logits processors, sampled logprobs)? A
    grammar does not: its bitmask applies to the verified rows too (structured_output/)."""
    return needs_logits_processors(request) or request.params.logprobs is not None

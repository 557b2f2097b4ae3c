"""Dynamic speculation: how many drafts to propose this step.

Owns the two rules. By batch size: the config's table ``[[start_bs, end_bs, k], ...]``. By acceptance
(``dynamic_k="acceptance"``): the first ``WARMUP_STEPS`` engine steps that speculate use k_max; after
that k = best_k(alpha, c, v) in [0, k_max], the k maximising (1 - alpha^(k+1)) / ((1 - alpha)(k c + v))
(k = 0, plain decoding, scores 1), with alpha the acceptance measured so far (accepted / tested drafts),
and c and v measured against a plain decode step, as the engine times them: c = proposer seconds per
draft token / plain step seconds, v = verify step seconds / plain step seconds. A verify pass is dearer
than a plain step (k + 1 rows, the rejection sampler, the rollback), and v is what decides whether
speculation pays at all. Until a plain step is timed the rule takes v = 1 (Leviathan et al.'s assumption)
and, while it speculates, asks for one plain step (k = 0) at each probe. A configured ``cost_ratio`` is c
per verify step (v as measured). When k is 0 (speculation does not pay), every ``PROBE_EVERY``-th step
still proposes one draft so alpha and c keep being measured. Never proposes tokens itself.
"""

from __future__ import annotations

from minirunner.spec_decode.math import best_k
from minirunner.spec_decode.metrics import SpecStats

WARMUP_STEPS = 8
PROBE_EVERY = 10


class AcceptanceDrivenK:
    def __init__(self, k_max: int, cost_ratio: float | None):
        self.k_max, self.cost_ratio = k_max, cost_ratio
        self.num_decisions = 0  # steps that proposed with a chosen k (for the probe every PROBE_EVERY)
        self.propose_s = 0.0  # proposer seconds, summed with the draft tokens they made
        self.draft_steps = 0
        self.verify_s = 0.0
        self.verify_steps = 0
        self.plain_s = 0.0  # decode steps that ran without drafts, timed as verify steps are
        self.plain_steps = 0

    def observe(self, propose_s: float, max_k: int, verify_s: float) -> None:
        """One engine step that speculated: its proposer time for ``max_k`` draft passes, and its
        target step's device time (CUDA events, read with the step's output; on a CPU the host clock)."""
        self.propose_s += propose_s
        self.draft_steps += max_k
        self.verify_s += verify_s
        self.verify_steps += 1

    def observe_plain(self, step_s: float) -> None:
        """One decode step without drafts (every request one token), timed as :meth:`observe` times a
        verify step: the denominator of c and v."""
        self.plain_s += step_s
        self.plain_steps += 1

    def measured_cost_ratio(self) -> float | None:
        """c per verify step: proposer seconds per draft token / verify step seconds."""
        if not (self.draft_steps and self.verify_steps and self.verify_s > 0):
            return None
        return (self.propose_s / self.draft_steps) / (self.verify_s / self.verify_steps)

    def measured_verify_ratio(self) -> float | None:
        """v: verify step seconds / plain decode step seconds (None until both were timed)."""
        if not (self.verify_steps and self.plain_steps and self.plain_s > 0):
            return None
        return (self.verify_s / self.verify_steps) / (self.plain_s / self.plain_steps)

    def choose(self, stats: SpecStats) -> int:
        """The k for the next step that proposes; pure (asking changes nothing, :meth:`advance` moves on)."""
        c_verify = self.cost_ratio if self.cost_ratio is not None else self.measured_cost_ratio()
        alpha = stats.alpha
        if stats.num_steps < WARMUP_STEPS or alpha is None or c_verify is None:
            return self.k_max
        v = self.measured_verify_ratio()
        probe = (self.num_decisions + 1) % PROBE_EVERY == 0
        # c against the plain step is c_verify * v: E / (k c + v) = E / (v (k c_verify + 1))
        k = best_k(alpha, c_verify * (v or 1.0), self.k_max, v or 1.0)
        if k == 0 and probe:
            return 1  # a draft probe: alpha and c keep being measured
        if k > 0 and probe and v is None:
            return 0  # a plain probe: v = 1 is an assumption until a plain decode step is timed
        return k

    def advance(self) -> None:
        """A step proposed with the k :meth:`choose` gave: the probe counter moves on."""
        self.num_decisions += 1

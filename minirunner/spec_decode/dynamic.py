"""Dynamic speculation: how many drafts to propose this step.

Owns the two rules. By batch size: the config's table ``[[start_bs, end_bs, k], ...]``. By acceptance
(``dynamic_k="acceptance"``): the first ``WARMUP_STEPS`` engine steps that speculate use k_max; after
that k = best_k(alpha, c) in [0, k_max], the k maximising (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)),
with alpha the acceptance measured so far (accepted / tested drafts) and c the configured cost_ratio or
else the measured one (proposer seconds per draft token / target seconds per verification step). When
that k is 0 (speculation does not pay), every ``PROBE_EVERY``-th step still proposes one draft so alpha
and c keep being measured. Never proposes tokens itself.
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

    def observe(self, propose_s: float, max_k: int, verify_s: float) -> None:
        """One engine step that speculated: its proposer time for ``max_k`` draft passes, and its
        target step's device time (CUDA events, read with the step's output; on a CPU the host clock)."""
        self.propose_s += propose_s
        self.draft_steps += max_k
        self.verify_s += verify_s
        self.verify_steps += 1

    def measured_cost_ratio(self) -> float | None:
        if not (self.draft_steps and self.verify_steps and self.verify_s > 0):
            return None
        return (self.propose_s / self.draft_steps) / (self.verify_s / self.verify_steps)

    def choose(self, stats: SpecStats) -> int:
        """The k for the next step that proposes; pure (asking changes nothing, :meth:`advance` moves on)."""
        c = self.cost_ratio if self.cost_ratio is not None else self.measured_cost_ratio()
        alpha = stats.alpha
        if stats.num_steps < WARMUP_STEPS or alpha is None or c is None:
            return self.k_max
        k = best_k(alpha, c, self.k_max)
        if k == 0 and (self.num_decisions + 1) % PROBE_EVERY == 0:
            return 1
        return k

    def advance(self) -> None:
        """A step proposed with the k :meth:`choose` gave: the probe counter moves on."""
        self.num_decisions += 1

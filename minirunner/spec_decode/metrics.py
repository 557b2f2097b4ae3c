"""SpecStats: what speculation did for one request or for the whole engine — drafts proposed, drafts
accepted (overall and by position), mean emitted run length, the measured acceptance alpha, and the
time spent proposing vs verifying. Plain counters; never changes what is generated."""

from __future__ import annotations

from dataclasses import dataclass, field

from minirunner.spec_decode.math import expected_tokens_per_step


@dataclass
class SpecStats:
    num_steps: int = 0  # verification steps (one request, one target pass, >= 1 draft)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_tested_tokens: int = 0  # drafts the target tested: the accepted ones and the first rejected
    num_emitted_tokens: int = 0  # accepted + the target's own token, before stop truncation
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    steps_by_k: dict[int, int] = field(default_factory=dict)
    propose_s: float = 0.0
    verify_s: float = 0.0

    def record(self, k: int, num_accepted: int) -> None:
        """One verification of k >= 1 drafts of which the first ``num_accepted`` passed."""
        self.num_steps += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += num_accepted
        self.num_tested_tokens += num_accepted + (num_accepted < k)
        self.num_emitted_tokens += num_accepted + 1
        self.steps_by_k[k] = self.steps_by_k.get(k, 0) + 1
        for lst in (self.drafted_by_position, self.accepted_by_position):
            lst.extend([0] * (k - len(lst)))
        for j in range(k):
            self.drafted_by_position[j] += 1
            self.accepted_by_position[j] += j < num_accepted

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed drafts."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance probability (maximum likelihood): accepted / tested drafts."""
        return self.num_accepted_tokens / self.num_tested_tokens if self.num_tested_tokens else None

    @property
    def acceptance_by_position(self) -> list[float]:
        """Fraction of steps that proposed a j-th draft in which it was accepted."""
        return [a / d for a, d in zip(self.accepted_by_position, self.drafted_by_position, strict=True)]

    @property
    def mean_accepted_length(self) -> float | None:
        """Mean tokens emitted per verification step (accepted drafts + 1)."""
        return self.num_emitted_tokens / self.num_steps if self.num_steps else None

    def expected_accepted_length(self, alpha: float | None = None) -> float | None:
        """(1 - a^(k+1)) / (1 - a) averaged over the steps' k, at the measured alpha by default."""
        alpha = self.alpha if alpha is None else alpha
        if alpha is None or not self.num_steps:
            return None
        total = sum(n * expected_tokens_per_step(alpha, k) for k, n in self.steps_by_k.items())
        return total / self.num_steps

    def as_dict(self) -> dict:
        return dict(num_steps=self.num_steps, num_draft_tokens=self.num_draft_tokens,
                    num_accepted_tokens=self.num_accepted_tokens,
                    num_tested_tokens=self.num_tested_tokens,
                    num_emitted_tokens=self.num_emitted_tokens,
                    acceptance_rate=self.acceptance_rate, alpha=self.alpha,
                    acceptance_by_position=self.acceptance_by_position,
                    mean_accepted_length=self.mean_accepted_length,
                    expected_accepted_length=self.expected_accepted_length(),
                    steps_by_k=dict(self.steps_by_k), propose_s=self.propose_s,
                    verify_s=self.verify_s)

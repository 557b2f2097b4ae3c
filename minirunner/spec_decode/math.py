"""The arithmetic of speculative decoding (Leviathan et al. 2023), and a Monte Carlo check of it.

Owns closed forms only: expected tokens per target pass, the walltime factor for a cost ratio c, the best
k. Never runs a model. alpha = per-token acceptance probability, k = draft tokens per step, c = time of one
draft step / time of one plain target step, v = time of one verify pass (the target over k + 1 tokens, the
rejection sampler, the rollback, the engine's per-step work) / time of one plain target step.
"""

from __future__ import annotations

import numpy as np


def _check(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is an acceptance probability and must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens emitted per target pass] = (1 - alpha^(k+1)) / (1 - alpha) (= k + 1 at alpha = 1)."""
    _check(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def walltime_factor(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """Speedup over plain decoding: expected tokens per step / (k * c + v), where one speculative
    step costs k draft steps plus one verify pass of v plain steps (v = 1: a verify pass costs what a
    plain step costs, Leviathan et al.'s assumption). k = 0 is plain decoding: 1."""
    if c < 0:
        raise ValueError(f"the cost ratio c must be >= 0, got {c}")
    if not v > 0:
        raise ValueError(f"the verify cost v (verify pass / plain step) must be > 0, got {v}")
    if k == 0:
        _check(alpha, k)
        return 1.0
    return expected_tokens_per_step(alpha, k) / (k * c + v)


def best_k(alpha: float, c: float, k_max: int = 16, v: float = 1.0) -> int:
    """The k in [0, k_max] with the largest walltime factor (0: speculation does not pay)."""
    factors = [walltime_factor(alpha, k, c, v) for k in range(k_max + 1)]
    return int(np.argmax(factors))


def monte_carlo_tokens_per_step(alpha: float, k: int, num_steps: int, seed: int = 0) -> float:
    """Simulated mean tokens per step: each of k drafts is accepted with probability alpha until the
    first rejection; a step emits the accepted drafts plus one target token."""
    _check(alpha, k)
    rng = np.random.default_rng(seed)
    accept = rng.random((num_steps, k)) < alpha
    accepted = np.cumprod(accept, axis=1).sum(axis=1) if k else np.zeros(num_steps)
    return float((accepted + 1).mean())

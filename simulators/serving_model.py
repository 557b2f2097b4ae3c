"""A queueing model of a continuous-batching server (notebook 09): where the knee is, and why.

Owns three pieces, pure Python and numpy (it never imports the runner):

- ``StepTime``: a step's time as a line in what the step does, ``alpha + beta * decodes + gamma * prefill
  tokens``, fitted by least squares to an engine's step trace (``LLM.get_step_trace()`` rows);
- ``capacity``: the requests per second a server sustains when ``max_num_seqs`` requests are always running
  (the fluid view: each request holds one of the seats for ``output_len`` steps), the knee of the latency
  curve;
- ``simulate``: a discrete-event model of the runner's scheduler (running requests first, one decode token
  each, then prefill chunks under the token budget, then waiting requests in arrival order while seats and
  budget last), stepping a clock by ``StepTime``; it gives every request's TTFT and inter-token gaps for
  any arrival times.

With ``max_num_seqs = 1``, a constant step time and free prefill, ``simulate`` is an M/D/1 queue (the tests
compare it with the Pollaczek–Khinchine mean wait); with every request arriving at once it is exact waves.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["StepTime", "capacity", "simulate", "SimRequest", "percentiles", "mdl_mean_wait",
           "poisson_arrivals"]


@dataclass(frozen=True)
class StepTime:
    """Seconds one engine step takes: ``alpha`` (fixed per step: launch, sampling, host work) +
    ``beta`` per decoding request + ``gamma`` per prefill token."""

    alpha: float
    beta: float
    gamma: float

    def __call__(self, decodes: int, prefill_tokens: int) -> float:
        return self.alpha + self.beta * decodes + self.gamma * prefill_tokens

    @classmethod
    def fit(cls, steps: list[dict]) -> StepTime:
        """Least squares over trace rows with ``num_decode_tokens``, ``num_prefill_tokens`` and
        ``duration_s`` (an engine's step trace). Coefficients are kept non-negative."""
        if len(steps) < 3:
            raise ValueError("fitting a step time needs at least 3 steps")
        a = np.array([[1.0, s["num_decode_tokens"], s["num_prefill_tokens"]] for s in steps])
        y = np.array([s["duration_s"] for s in steps])
        if np.linalg.matrix_rank(a) < 3:
            raise ValueError("the steps must vary both the decode count and the prefill tokens")
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        return cls(*(max(0.0, float(c)) for c in coef))


def capacity(step: StepTime, prompt_len: float, output_len: int, max_num_seqs: int) -> float:
    """Requests per second with ``max_num_seqs`` requests always running (prompts of ``prompt_len``
    tokens, ``output_len`` tokens out, the first sampled by the prefill step). Each request holds a seat
    for ``output_len`` steps: one that prefills it and ``output_len - 1`` that decode, so ``S`` requests
    cost ``output_len * alpha + (output_len - 1) * beta * S + gamma * S * prompt_len`` seconds. Exact
    for waves of ``S`` equal requests; the mean of a staggered steady state."""
    if output_len < 1 or max_num_seqs < 1:
        raise ValueError("output_len and max_num_seqs must be at least 1")
    s = max_num_seqs
    return s / (output_len * step.alpha + (output_len - 1) * step.beta * s + step.gamma * s * prompt_len)


@dataclass
class SimRequest:
    """One simulated request: its arrival, its first token's time and every later token's time."""

    arrival: float
    prompt_len: int
    output_len: int
    prefilled: int = 0
    token_times: list[float] | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t[:-1], t[1:], strict=True)]

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.arrival


def simulate(arrivals, prompt_lens, output_lens, step: StepTime, max_num_seqs: int,
             max_num_batched_tokens: int = 2048) -> list[SimRequest]:
    """Run the scheduler's rules over requests arriving at ``arrivals`` (seconds, any order); returns the
    requests in arrival order with their token times. A request that arrives during a step waits for the
    next one; the step that finishes a prompt samples its first token."""
    order = np.argsort(np.asarray(arrivals, dtype=float), kind="stable")
    reqs = [SimRequest(float(arrivals[i]), int(prompt_lens[i]), int(output_lens[i]), token_times=[])
            for i in order]
    if any(r.prompt_len < 1 or r.output_len < 1 for r in reqs):
        raise ValueError("every request needs a prompt token and an output token")
    if max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")
    pending = deque(reqs)  # not yet arrived or not yet admitted, in arrival order
    running: list[SimRequest] = []
    t = 0.0
    while pending or running:
        if not running and pending[0].arrival > t:
            t = pending[0].arrival  # idle: the clock jumps to the next arrival
        budget = max_num_batched_tokens
        decoding = [r for r in running if r.prefilled == r.prompt_len][:budget]
        budget -= len(decoding)
        chunks: list[tuple[SimRequest, int]] = []
        for r in running:  # unfinished prompts first, in admission order
            if r.prefilled < r.prompt_len and budget > 0:
                n = min(budget, r.prompt_len - r.prefilled)
                chunks.append((r, n))
                budget -= n
        while pending and pending[0].arrival <= t and len(running) < max_num_seqs and budget > 0:
            r = pending.popleft()
            running.append(r)
            n = min(budget, r.prompt_len)
            chunks.append((r, n))
            budget -= n
        t += step(len(decoding), sum(n for _, n in chunks))
        for r in decoding:
            r.token_times.append(t)
        for r, n in chunks:
            r.prefilled += n
            if r.prefilled == r.prompt_len:
                r.token_times.append(t)
        running = [r for r in running if len(r.token_times) < r.output_len]
    return reqs


def percentiles(values, qs=(50, 99)) -> dict[int, float]:
    """numpy's linear-interpolation percentiles (as ``bench serve`` reports them); NaN when empty."""
    a = np.asarray(list(values), dtype=float)
    return {q: float(np.percentile(a, q)) if a.size else math.nan for q in qs}


def mdl_mean_wait(rate: float, service: float) -> float:
    """The mean time in queue of an M/D/1 queue (Pollaczek–Khinchine): rho * s / (2 (1 - rho))."""
    rho = rate * service
    if not 0 <= rho < 1:
        raise ValueError(f"the queue is unstable: rate x service = {rho:.3f} >= 1")
    return rho * service / (2 * (1 - rho))


def poisson_arrivals(num: int, rate: float, seed: int) -> np.ndarray:
    """Seconds from the start of each of ``num`` arrivals at ``rate`` per second (exponential gaps,
    seeded); rate inf: all at 0."""
    if math.isinf(rate):
        return np.zeros(num)
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, num))

"""Instructor data for notebook 09, kept out of the student's view (the notebook never imports it).

Owns the rubrics of the two "run, vary, explain" questions, and the goodput implement-it's committed
solutions: ``GOODPUT_WRONG`` (known-wrong solutions the checker must reject, each a real mistake) and
``GOODPUT_VALID`` (two alternatives, written another way, that it must accept).
tests/test_serving_exercises.py holds the checker to both.
"""

from __future__ import annotations

import numpy as np

RUBRICS = {
    1: [
        "2 pts: the measured knee (saturated requests/s) for each MAX_SEQS, with the model's "
        "prediction beside it.",
        "2 pts: the knee moves up with more seats but less than in proportion: capacity = S / (O alpha "
        "+ (O - 1) beta S + gamma S P), so the fixed alpha is shared by more requests while beta S grows.",
        "2 pts: ITL below the knee follows the batch the rate sustains (Little: about rate x O x step); "
        "above it ITL is flat at the step time of S running requests, and TTFT carries the queue.",
        "2 pts: ITL at saturation rises from step(2) to step(8): more seats buy throughput with latency.",
        "2 pts: where the model misses, with a cause: the client and the server share the cores, the HTTP "
        "and streaming work per token is not in the offline step time, a shared machine's load changes "
        "between runs.",
    ],
    2: [
        "2 pts: the table or plot of worst decoder gap and the long request's TTFT for at least four "
        "budgets.",
        "2 pts: a smaller budget lowers the worst gap towards the plain decode step (alpha + beta d) "
        "because each chunk is budget - d tokens.",
        "2 pts: the long request's TTFT grows as the budget shrinks: ceil(L / (budget - d)) steps, each "
        "paying alpha again.",
        "2 pts: a budget for the bound, derived from alpha + beta d + gamma (budget - d) <= 2 x step, and "
        "its cost.",
        "2 pts: below some budget the fixed per-step cost dominates (and a budget at or below d starves "
        "prefill entirely), so the gap stops falling while TTFT keeps rising.",
    ],
}


def _tpot(r: dict) -> float:
    n = r["output_tokens"]
    return (r["e2e"] - r["ttft"]) / (n - 1) if n > 1 else 0.0


def _ok(r: dict) -> bool:
    return r["error"] is None


# --- known-wrong solutions (each must be rejected) ---------------------------------------------

def ttft_only(requests, duration, slo_ttft, slo_tpot):
    """Counts a request that meets TTFT but misses TPOT."""
    return sum(_ok(r) and r["ttft"] <= slo_ttft for r in requests) / duration


def tpot_with_ttft(requests, duration, slo_ttft, slo_tpot):
    """TPOT as e2e / output tokens: the first token's wait counted as decode time."""
    return sum(_ok(r) and r["ttft"] <= slo_ttft and r["e2e"] / r["output_tokens"] <= slo_tpot
               for r in requests) / duration


def longest_request_as_duration(requests, duration, slo_ttft, slo_tpot):
    """Divides by the longest request's e2e instead of the run's duration."""
    good = sum(_ok(r) and r["ttft"] <= slo_ttft and _tpot(r) <= slo_tpot for r in requests)
    return good / max(r["e2e"] for r in requests if _ok(r))


def strict_bounds(requests, duration, slo_ttft, slo_tpot):
    """'Meets' read as 'under': a request exactly at its bound is dropped."""
    return sum(_ok(r) and r["ttft"] < slo_ttft and _tpot(r) < slo_tpot for r in requests) / duration


def fraction_not_rate(requests, duration, slo_ttft, slo_tpot):
    """The share of completed requests that met the SLOs, not a rate."""
    done = [r for r in requests if _ok(r)]
    return sum(r["ttft"] <= slo_ttft and _tpot(r) <= slo_tpot for r in done) / len(done)


def one_token_fails(requests, duration, slo_ttft, slo_tpot):
    """Treats a one-token request as missing TPOT (it has no gap to measure)."""
    return sum(_ok(r) and r["output_tokens"] > 1 and r["ttft"] <= slo_ttft and _tpot(r) <= slo_tpot
               for r in requests) / duration


GOODPUT_WRONG = {f.__name__: f for f in (ttft_only, tpot_with_ttft, longest_request_as_duration,
                                         strict_bounds, fraction_not_rate, one_token_fails)}


# --- valid alternatives (each must be accepted) ------------------------------------------------

def with_numpy(requests, duration, slo_ttft, slo_tpot):
    """Vectorised: NaN for a failed request never compares true; TPOT bound multiplied out."""
    ttft = np.array([np.nan if r["ttft"] is None else r["ttft"] for r in requests])
    e2e = np.array([np.nan if r["e2e"] is None else r["e2e"] for r in requests])
    gaps = np.array([max(r["output_tokens"] - 1, 0) for r in requests])
    good = (ttft <= slo_ttft) & ((gaps == 0) | (e2e - ttft <= slo_tpot * gaps))
    return float(good.sum()) / duration


def by_exclusion(requests, duration, slo_ttft, slo_tpot):
    """Starts from every completed request and removes the ones that miss a bound."""
    done = [r for r in requests if r["error"] is None]
    missed = {id(r) for r in done if r["ttft"] > slo_ttft}
    missed |= {id(r) for r in done if r["output_tokens"] >= 2
               and (r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) > slo_tpot}
    return (len(done) - len(missed)) / duration


GOODPUT_VALID = {f.__name__: f for f in (with_numpy, by_exclusion)}

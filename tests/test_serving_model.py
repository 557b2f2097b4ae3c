"""simulators.serving_model against closed-form cases: exact waves when every request arrives at once,
an M/D/1 queue (Pollaczek–Khinchine) with one seat, Little's law, the token budget's chunks, and the
step-time fit recovering known coefficients."""

from __future__ import annotations

import numpy as np
import pytest

from simulators.serving_model import (
    StepTime,
    capacity,
    mdl_mean_wait,
    percentiles,
    poisson_arrivals,
    simulate,
)


def test_all_at_once_runs_in_exact_waves():
    step = StepTime(alpha=0.004, beta=0.0005, gamma=0.0002)
    n, s, p, o = 12, 4, 10, 6
    reqs = simulate(np.zeros(n), [p] * n, [o] * n, step, max_num_seqs=s)
    wave = step(0, s * p) + (o - 1) * step(s, 0)  # one prefill step, then o - 1 decode steps
    for w in range(n // s):
        for r in reqs[w * s:(w + 1) * s]:
            assert r.ttft == pytest.approx(w * wave + step(0, s * p))
            assert r.e2e == pytest.approx((w + 1) * wave)
            assert r.itl == pytest.approx([step(s, 0)] * (o - 1))
    # the capacity formula is the waves' rate
    assert capacity(step, p, o, s) == pytest.approx(s / wave)


def test_one_seat_is_an_md1_queue():
    alpha, o, rate = 1.0, 5, 0.14  # service 5 s, load 0.7
    step = StepTime(alpha, 0.0, 0.0)
    arrivals = poisson_arrivals(20000, rate, seed=3)
    reqs = simulate(arrivals, [1] * len(arrivals), [o] * len(arrivals), step, max_num_seqs=1)
    waits = [r.ttft - alpha for r in reqs]  # the first token comes one step after service starts
    assert np.mean(waits) == pytest.approx(mdl_mean_wait(rate, o * alpha), rel=0.06)
    assert min(waits) == pytest.approx(0.0, abs=1e-12)  # an idle server starts at once


def test_littles_law_holds():
    step = StepTime(0.003, 0.001, 0.0001)
    rate = 30.0
    arrivals = poisson_arrivals(3000, rate, seed=1)
    reqs = simulate(arrivals, [20] * 3000, [8] * 3000, step, max_num_seqs=6)
    sojourn = np.array([r.e2e for r in reqs])
    end = max(r.token_times[-1] for r in reqs)
    # time-average number in system = total sojourn / span; Little: = throughput x mean sojourn
    assert sojourn.sum() / end == pytest.approx(len(reqs) / end * sojourn.mean())
    assert len(reqs) / end == pytest.approx(rate, rel=0.05)  # below capacity: all of it is served


def test_the_budget_chunks_a_long_prompt_and_decodes_go_first():
    step = StepTime(1.0, 0.0, 0.0)  # one unit per step: times count steps
    # a request decoding, then a 10-token prompt arriving while it does; budget 4 = 1 decode + 3 prefill
    reqs = simulate([0.0, 0.5], [1, 10], [8, 2], step, max_num_seqs=4, max_num_batched_tokens=4)
    long = reqs[1]
    assert long.ttft == pytest.approx(5.0 - 0.5)  # chunks of 3, 3, 3, 1 in steps 2-5
    assert reqs[0].itl == [1.0] * 7  # the decode was never skipped


def test_fit_recovers_a_known_step_time():
    true = StepTime(0.004, 0.0003, 0.0002)
    rng = np.random.default_rng(0)
    rows = [dict(num_decode_tokens=int(d), num_prefill_tokens=int(p), duration_s=true(int(d), int(p)))
            for d, p in zip(rng.integers(0, 16, 40), rng.integers(0, 200, 40), strict=True)]
    got = StepTime.fit(rows)
    assert (got.alpha, got.beta, got.gamma) == pytest.approx((true.alpha, true.beta, true.gamma))
    with pytest.raises(ValueError, match="vary"):
        StepTime.fit([dict(num_decode_tokens=4, num_prefill_tokens=0, duration_s=0.01)] * 5)


def test_percentiles_and_bad_input():
    assert percentiles([1, 2, 3, 4], (50,)) == {50: 2.5}
    assert np.isnan(percentiles([], (99,))[99])
    with pytest.raises(ValueError, match="unstable"):
        mdl_mean_wait(1.0, 1.0)
    with pytest.raises(ValueError):
        simulate([0.0], [0], [1], StepTime(1, 0, 0), 1)
    assert poisson_arrivals(3, float("inf"), 0).tolist() == [0.0, 0.0, 0.0]

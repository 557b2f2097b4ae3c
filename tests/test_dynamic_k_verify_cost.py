"""The acceptance-driven k weighs a verify pass at what it costs: v = verify step / plain step, measured by
the engine as it measures c. Notebook 06 §6 measured alpha = 0.67, c = 0.26 and v = 2.2 on a CPU, and a
speed-up of 0.97x: the rule must not speculate there, and with v = 1 it must give the answer it gave
before v was in it (Leviathan et al.'s walltime factor E / (k c + 1))."""

from __future__ import annotations

import pytest

from minirunner.spec_decode.dynamic import PROBE_EVERY, WARMUP_STEPS, AcceptanceDrivenK
from minirunner.spec_decode.math import best_k, walltime_factor
from minirunner.spec_decode.metrics import SpecStats


def old_rule(alpha: float, c: float, k_max: int) -> int:
    """The k maximising (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), written out here."""
    scores = [(1 - alpha ** (k + 1)) / (1 - alpha) / (k * c + 1) for k in range(k_max + 1)]
    return scores.index(max(scores))


def test_the_measured_verify_cost_turns_speculation_off():
    assert best_k(0.67, 0.26, 4, v=2.2) == 0
    assert best_k(0.67, 0.26, 16, v=2.2) == 0
    # every k > 0 predicts a slow-down, as the notebook measured (0.97x at k = 3)
    assert all(walltime_factor(0.67, k, 0.26, 2.2) < 1 for k in range(1, 17))


@pytest.mark.parametrize("alpha,c", [(0.67, 0.26), (0.8, 0.05), (0.5, 0.3), (0.9, 0.6), (0.1, 0.5)])
def test_with_v_1_the_rule_is_the_old_one(alpha, c):
    assert best_k(alpha, c, 6, v=1.0) == best_k(alpha, c, 6) == old_rule(alpha, c, 6)
    assert best_k(0.67, 0.26, 4) > 0  # the old rule speculates at the notebook's alpha and c


def test_v_below_1_or_zero_k_is_plain():
    assert walltime_factor(0.67, 0, 0.26, 2.2) == 1.0  # k = 0 is a plain step whatever v is
    with pytest.raises(ValueError, match="verify cost"):
        walltime_factor(0.67, 2, 0.26, 0.0)


def controller(alpha_steps: int, accepted: int, k: int, propose_s: float, verify_s: float,
               plain_s: float | None) -> tuple[AcceptanceDrivenK, SpecStats]:
    """A controller that saw ``alpha_steps`` verify steps of k drafts with ``accepted`` accepted each,
    timed as given, and (unless None) a plain decode step of ``plain_s``."""
    dyn, stats = AcceptanceDrivenK(4, cost_ratio=None), SpecStats()
    for _ in range(alpha_steps):
        stats.record(k, accepted)
        dyn.observe(propose_s, k, verify_s)
    if plain_s is not None:
        dyn.observe_plain(plain_s)
    return dyn, stats


def test_the_engine_rule_reads_v_from_a_timed_plain_step():
    # alpha = 2/3 (each step: 2 accepted of 3, the third tested and rejected), a plain step of 2.5 ms,
    # a verify step of 2.2 plain steps, a draft pass of 0.26 plain steps
    plain = 2.5e-3
    dyn, stats = controller(WARMUP_STEPS, 2, 3, 3 * 0.26 * plain, 2.2 * plain, plain)
    assert stats.alpha == pytest.approx(2 / 3)
    assert dyn.measured_verify_ratio() == pytest.approx(2.2)
    assert dyn.choose(stats) == 0
    # the same run with a verify step as dear as a plain one: the old answer
    dyn1, stats1 = controller(WARMUP_STEPS, 2, 3, 3 * 0.26 * plain, plain, plain)
    assert dyn1.choose(stats1) == old_rule(2 / 3, 0.26, 4) > 0


def test_until_a_plain_step_is_timed_the_rule_assumes_v_1_and_asks_for_one_at_a_probe():
    plain = 2.5e-3
    dyn, stats = controller(WARMUP_STEPS, 2, 3, 3 * 0.26 * plain, 2.2 * plain, None)
    assert dyn.measured_verify_ratio() is None
    ks = []
    for _ in range(2 * PROBE_EVERY):
        ks.append(dyn.choose(stats))
        if ks[-1]:
            dyn.advance()
    # c is read against the verify step (0.26 / 2.2) with v = 1 until a probe times a plain step
    assert ks[0] == old_rule(2 / 3, 0.26 / 2.2, 4) > 0
    assert 0 in ks
    first_zero = ks.index(0)
    assert (first_zero + 1) % PROBE_EVERY == 0
    dyn.observe_plain(plain)  # the probe's plain step, read back: v = 2.2 now
    assert dyn.choose(stats) == 1  # still the probe's turn: k = 0 from here on, but one draft probes
    dyn.advance()
    assert [dyn.choose(stats) for _ in range(3)] == [0, 0, 0]

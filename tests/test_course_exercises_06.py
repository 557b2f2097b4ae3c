"""Notebook 06's exercises and implement-it task: each checker accepts the right answer, rejects known
wrong ones with a reason, and says "not answered yet" to an untouched cell; the rejection-rule helpers
agree with the runner's twin (minirunner/kernels/rejection_sampling.py) and with closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minirunner.kernels.rejection_sampling import accept_uniform, rejection_sample_ref
from minirunner.kernels.sampling import uniform_noise
from minirunner.spec_decode.dynamic import PROBE_EVERY, WARMUP_STEPS, AcceptanceDrivenK
from minirunner.spec_decode.metrics import SpecStats
from simulators.exercises import NotImplementedYet
from simulators.rejection import (
    acceptance_by_position,
    acceptance_probability,
    chi2_sf,
    chi_square,
    emitted_distribution,
    make_acceptance_exercise,
    make_histogram_exercise,
    make_regime_exercise,
    rejection_sample_chain,
    rejection_task,
    residual,
)
from simulators.speculative import DecoderShape, roofline_speedup, roofline_step, split_host_cost
from simulators.speculative_exercises import dynamic_k_task

SEEDS = range(25)
# the known-wrong samplers take log(0) where the residual is empty, as a student's first try would
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


def twin_chain(p, q, draft, u, g, seed, position):
    """The runner's twin on one request with k = len(draft) drafts at temperature 1 (as notebook 06)."""
    k = len(draft)
    out = rejection_sample_ref(
        torch.as_tensor(draft, dtype=torch.long), torch.tensor([k]), torch.as_tensor(q, dtype=torch.float32),
        torch.as_tensor(p, dtype=torch.float32).log(), torch.ones(1), torch.zeros(1, dtype=torch.long),
        torch.ones(1), torch.tensor([seed]), torch.tensor([position]))
    return [t for t in out[0].tolist() if t >= 0]


def runner_noise(seed, position, k, vocab):
    seeds = torch.full((k + 1,), seed, dtype=torch.long)
    positions = position + torch.arange(k + 1)
    u = accept_uniform(seeds[:k], positions[:k]).numpy()
    g = (-torch.log(-torch.log(uniform_noise(seeds, positions, vocab)))).numpy()
    return u, g


@pytest.fixture(scope="module")
def task():
    return rejection_task(twin_chain, runner_noise)


# --- the exercises -------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_acceptance_exercise(seed):
    ex = make_acceptance_exercise(seed)
    assert ex.check(ex.solution()).correct
    assert not ex.check(None).answered
    p, q = _numbers(ex.question)
    assert ex.solution() == pytest.approx(acceptance_probability(p, q), abs=1e-9)
    dot = float(np.dot(p, q))
    if abs(dot - ex.solution()) > 0.01:
        assert not ex.check(dot).correct and "p * q" in ex.check(dot).why
    assert not ex.check(ex.solution() + 0.05).correct
    assert not ex.check("about half").correct


@pytest.mark.parametrize("seed", SEEDS)
def test_histogram_exercise(seed):
    ex = make_histogram_exercise(seed)
    assert ex.check(ex.solution()).correct and not ex.check(None).answered
    p, q = _numbers(ex.question)
    n = int(ex.question.split("runs ")[1].split()[0])
    y = "ABCD".index(ex.question.split("tokens are ")[1][0])
    assert ex.solution() == round(n * p[y])
    if abs(q[y] - p[y]) > 0.01:
        assert not ex.check(n * q[y]).correct and "proposes" in ex.check(n * q[y]).why
    if min(p[y], q[y]) < p[y] - 0.01:
        assert not ex.check(n * min(p[y], q[y])).correct


@pytest.mark.parametrize("seed", SEEDS)
def test_regime_exercise(seed):
    ex = make_regime_exercise(seed)
    assert ex.check(ex.solution()).correct and ex.check(ex.solution().upper()).correct
    wrong = [c for c in "abc" if c != ex.solution()]
    assert len(wrong) == 2 and not any(ex.check(c).correct for c in wrong)
    assert not ex.check(None).answered and not ex.check("d").correct


@pytest.mark.parametrize("seed", SEEDS)
def test_regime_options_are_of_equal_weight_and_hints_wait_for_a_wrong_answer(seed):
    ex = make_regime_exercise(seed)
    options = [line[4:] for line in ex.question.splitlines() if line[:1] == "(" and line[2:4] == ") "]
    lengths = [len(o) for o in options]
    assert len(options) == 3 and max(lengths) <= 1.2 * min(lengths)
    assert all(":" in o for o in options)  # one form: "<what>: <why>"
    unanswered = str(ex.check(None))
    wrong = [str(ex.check(c)) for c in "abc" if c != ex.solution()]
    assert "bandwidth" not in unanswered and all("bandwidth" in w for w in wrong)
    assert wrong[0] != wrong[1]  # each misconception gets its own reason


@pytest.mark.parametrize("make", [make_acceptance_exercise, make_histogram_exercise])
def test_numeric_exercises_give_no_formula_before_an_attempt(make):
    for seed in SEEDS:
        unanswered = str(make(seed).check(None))
        assert "min(" not in unanswered and "max(" not in unanswered and "P(" not in unanswered


def test_the_regime_exercise_asks_all_three_regimes():
    asked = {make_regime_exercise(s).question.split(".")[0] for s in range(40)}
    assert len(asked) == 3


def _numbers(question):
    lines = question.splitlines()
    dist = lambda line: [float(x.split(": ")[1]) for x in line.split("{")[1].rstrip("}").split(", ")]  # noqa: E731
    return np.array(dist(lines[0])), np.array(dist(lines[1]))


# --- the implement-it task ----------------------------------------------------------------------

def test_the_reference_solution_passes(task):
    verdict = task.check(rejection_sample_chain)
    assert verdict.correct, verdict.why


def test_the_cases_cover_first_later_and_bonus(task):
    kinds = []
    for case in task.cases:
        k, n = len(case["draft"]), len(twin_chain(**case))
        kinds.append("bonus" if n == k + 1 else "first" if n == 1 else "later")
    assert {"bonus", "first", "later"} <= set(kinds)


def test_the_reference_matches_the_twin_on_many_random_chains():
    more = rejection_task(twin_chain, runner_noise, vocab=11, seed=3)
    assert more.check(rejection_sample_chain).correct


def _resample_from_p(p, q, draft, u, g, **_):
    out = []
    for j, x in enumerate(draft):
        if p[j, x] >= u[j] * q[j, x]:
            out.append(int(x))
            continue
        return out + [int(np.argmax(np.log(p[j]) + g[j]))]
    return out + [int(np.argmax(np.log(p[-1]) + g[-1]))]


def _inverted_ratio(p, q, draft, u, g, **_):
    out = []
    for j, x in enumerate(draft):
        if q[j, x] >= u[j] * p[j, x]:
            out.append(int(x))
            continue
        return out + [int(np.argmax(np.log(np.clip(p[j] - q[j], 0, None)) + g[j]))]
    return out + [int(np.argmax(np.log(p[-1]) + g[-1]))]


def _no_bonus(p, q, draft, u, g, **_):
    full = rejection_sample_chain(p, q, draft, u, g)
    return full[:len(draft)]


def _does_not_stop(p, q, draft, u, g, **_):
    out = []
    for j, x in enumerate(draft):
        ok = p[j, x] >= u[j] * q[j, x]
        out.append(int(x) if ok else int(np.argmax(np.log(np.clip(p[j] - q[j], 0, None)) + g[j])))
    return out + [int(np.argmax(np.log(p[-1]) + g[-1]))]


@pytest.mark.parametrize("wrong", [_resample_from_p, _inverted_ratio, _no_bonus, _does_not_stop])
def test_known_wrong_samplers_are_rejected_with_their_case(task, wrong):
    verdict = task.check(wrong)
    assert verdict.answered and not verdict.correct
    assert "case" in verdict.why and "expected" in verdict.why


def test_an_untouched_stub_is_not_implemented_yet(task):
    def stub(p, q, draft, u, g, seed=None, position=None):
        raise NotImplementedYet

    verdict = task.check(stub)
    assert not verdict.answered and "not implemented yet" in str(verdict) and "wrong:" not in str(verdict)
    assert "u[j]" not in str(verdict)  # the algorithm is not given away before an attempt
    assert "u[j]" in task.check(_no_bonus).why  # a wrong attempt gets the hint


# --- the helpers ----------------------------------------------------------------------------------

def test_the_two_parts_of_the_emitted_law_add_up_to_p():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(9)), rng.dirichlet(np.ones(9))
        accepted, recovered = emitted_distribution(p, q)
        assert np.allclose(accepted + recovered, p)
        assert accepted.sum() == pytest.approx(acceptance_probability(p, q))
        assert residual(p, q).sum() == pytest.approx(1.0)
    assert residual(p, p).sum() == 0.0


def test_acceptance_by_position_on_hand_counted_runs():
    runs = [(3, 0), (3, 1), (3, 3), (3, 2), (2, 2)]
    unconditional, conditional = acceptance_by_position(runs)
    assert unconditional == [4 / 5, 3 / 5, 1 / 4]
    assert conditional == [4 / 5, 3 / 4, 1 / 2]  # the (2, 2) run never tested a third draft


def test_chi2_sf_against_known_quantiles():
    # chi-square upper quantiles from standard tables
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, abs=2e-4)
    assert chi2_sf(18.307, 10) == pytest.approx(0.05, abs=2e-4)
    assert chi2_sf(37.566, 20) == pytest.approx(0.01, abs=1e-4)
    assert chi2_sf(2.0, 2) == pytest.approx(np.exp(-1.0))  # dof 2 is an exponential
    assert chi2_sf(0.0, 5) == 1.0


def test_chi2_sf_agrees_with_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for dof in (1, 3, 7, 30, 120):
        for x in (0.5, dof * 0.8, dof + 0.1, dof * 1.5, dof * 3.0):
            assert chi2_sf(x, dof) == pytest.approx(stats.chi2.sf(x, dof), rel=1e-8, abs=1e-14)


def test_chi_square_accepts_samples_of_p_and_rejects_samples_of_q():
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(30))
    assert chi_square(np.bincount(rng.choice(30, 20000, p=p), minlength=30), p)["p_value"] > 1e-3
    assert chi_square(np.bincount(rng.choice(30, 20000, p=q), minlength=30), p)["p_value"] < 1e-6


def test_roofline_of_the_embedded_target_matches_its_model_card():
    target = DecoderShape(hidden=256, intermediate=704, layers=4, q_heads=4, kv_heads=2, head_dim=64,
                          vocab=1024)
    draft = DecoderShape(hidden=192, intermediate=512, layers=1, q_heads=4, kv_heads=2, head_dim=64,
                         vocab=1024)
    assert (target.matmul_params, draft.matmul_params) == (3_211_264, 638_976)  # MODEL_CARD.md
    step = roofline_step(target.matmul_params, 2, tokens=4, bandwidth=1e12, peak_flops=1e15)
    assert step["intensity"] == 4.0 and step["flops"] == 2 * 4 * 3_211_264


def test_verifying_is_free_while_memory_bound_and_not_once_compute_bound():
    n = 600_000_000
    one = roofline_step(n, 2, 1, 4.8e12, 989e12)
    five = roofline_step(n, 2, 5, 4.8e12, 989e12)
    assert one["bound"] == five["bound"] == "memory" and one["step_s"] == five["step_s"]
    big = roofline_step(n, 2, 256 * 5, 4.8e12, 989e12)
    assert big["bound"] == "compute"
    assert roofline_speedup(0.8, 4, n, n // 8, 1, 2, 4.8e12, 989e12) > 2
    assert roofline_speedup(0.8, 4, n, n // 8, 256, 2, 4.8e12, 989e12) < 1


def test_roofline_floor_counts_the_kv_read():
    qwen = DecoderShape(hidden=1024, intermediate=3072, layers=28, q_heads=16, kv_heads=8, head_dim=128,
                        vocab=151936)
    assert qwen.kv_bytes_per_token() == 2 * 28 * 8 * 128 * 2
    step = qwen.step(32, 1, 4096, 4.8e12, 989e12)
    assert step["kv_bytes"] == 32 * 4096 * qwen.kv_bytes_per_token()  # ~15 GB against 1.19 GB of weights
    assert step["bytes"] == step["weight_bytes"] + step["kv_bytes"]
    assert step["kv_bytes"] > 10 * step["weight_bytes"]
    no_kv = qwen.step(32, 1, 0, 4.8e12, 989e12)
    assert step["memory_s"] > 10 * no_kv["memory_s"]
    # a long context raises the speed-up of a shallow draft: the verify step reads the target's KV once
    # for k + 1 tokens, while the 4-layer draft's KV read per step is a seventh of the target's, so c falls
    draft = DecoderShape(hidden=1024, intermediate=3072, layers=4, q_heads=16, kv_heads=8, head_dim=128,
                         vocab=151936)
    assert roofline_speedup(0.8, 3, qwen, draft, 1, 2, 4.8e12, 989e12, context=32768) > \
        roofline_speedup(0.8, 3, qwen, draft, 1, 2, 4.8e12, 989e12, context=0)


def test_split_host_cost_recovers_an_engine_term_and_a_per_operator_cost():
    per_op, engine = split_host_cost(2e-3 + 200 * 5e-6, 200, 2e-3 + 90 * 5e-6, 90)
    assert per_op == pytest.approx(5e-6) and engine == pytest.approx(2e-3)
    with pytest.raises(ValueError):
        split_host_cost(1.0, 5, 2.0, 5)


# --- the dynamic-k implement-it, against the runner's own rule (spec_decode/dynamic.py) -----------

def runner_choose_k(history, plain_s, call, k_max, warmup_steps, probe_every):
    assert (warmup_steps, probe_every) == (WARMUP_STEPS, PROBE_EVERY)
    dyn, stats = AcceptanceDrivenK(k_max, cost_ratio=None), SpecStats()
    for s in history:
        stats.record(s["k"], s["accepted"])
        dyn.observe(s["propose_s"], s["k"], s["verify_s"])
    dyn.observe_plain(plain_s)
    dyn.num_decisions = call - 1
    return dyn.choose(stats)


def _chooser(alpha_of, c_of, warmup=True, probe=True, allow_zero=True, with_v=True):
    """A student's chooser, with one rule switchable to a known mistake."""
    def choose(history, plain_s, call, k_max, warmup_steps, probe_every):
        if warmup and len(history) < warmup_steps:
            return k_max
        accepted = sum(s["accepted"] for s in history)
        alpha = alpha_of(history, accepted)
        verify = sum(s["verify_s"] for s in history) / len(history)
        v = verify / plain_s if with_v else 1.0
        c = c_of(history) * v  # c_of: per verify step; c against the plain step is that times v
        ks = range(0 if allow_zero else 1, k_max + 1)
        factor = lambda k: 1.0 if k == 0 else (  # noqa: E731
            k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)) / (k * c + v)
        best = max(ks, key=factor)
        return 1 if probe and best == 0 and call % probe_every == 0 else best
    return choose


_tested = lambda h, a: a / sum(s["accepted"] + (s["accepted"] < s["k"]) for s in h)  # noqa: E731
_drafted = lambda h, a: a / sum(s["k"] for s in h)  # noqa: E731
_per_token = lambda h: (sum(s["propose_s"] for s in h) / sum(s["k"] for s in h)) / (  # noqa: E731
    sum(s["verify_s"] for s in h) / len(h))
_per_step = lambda h: sum(s["propose_s"] for s in h) / sum(s["verify_s"] for s in h)  # noqa: E731


@pytest.fixture(scope="module")
def k_task():
    return dynamic_k_task(runner_choose_k, WARMUP_STEPS, PROBE_EVERY)


def test_the_dynamic_k_reference_solution_agrees_with_the_runner(k_task):
    assert k_task.check(_chooser(_tested, _per_token)).correct
    for seed in range(1, 6):  # other seeds draw other histories; the same rule passes them all
        assert dynamic_k_task(runner_choose_k, WARMUP_STEPS, PROBE_EVERY, seed=seed).check(
            _chooser(_tested, _per_token)).correct


@pytest.mark.parametrize("wrong", [
    _chooser(_drafted, _per_token),               # acceptance over proposed drafts, not tested ones
    _chooser(_tested, _per_step),                 # c per step of k drafts, not per draft token
    _chooser(_tested, _per_token, warmup=False),  # trusts the first steps' noise
    _chooser(_tested, _per_token, probe=False),   # k = 0 forever: alpha and c are never measured again
    _chooser(_tested, _per_token, allow_zero=False),  # never turns speculation off
    _chooser(_tested, _per_token, with_v=False),  # a verify pass taken to cost one plain step (v = 1)
    lambda history, call, k_max, **_: k_max,      # always speculate as deep as allowed
])
def test_known_wrong_choosers_fail_and_get_the_hint_only_then(k_task, wrong):
    verdict = k_task.check(wrong)
    assert verdict.answered and not verdict.correct
    assert "case" in verdict.why and "Hint:" in verdict.why


def test_an_untouched_chooser_is_not_implemented_yet_without_the_algorithm(k_task):
    def stub(history, plain_s, call, k_max, warmup_steps, probe_every):
        raise NotImplementedYet

    verdict = k_task.check(stub)
    assert not verdict.answered and "not implemented yet" in str(verdict)
    assert "alpha" not in str(verdict) and "tested" not in str(verdict)

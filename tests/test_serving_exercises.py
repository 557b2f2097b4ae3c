"""Notebook 09's checkers: each exercise accepts its answer and rejects the known mistakes, says "not
answered yet" without a hint before a first attempt; the goodput checker accepts the reference and the two
committed alternatives and rejects every committed wrong solution; the reference agrees with ``bench
serve``'s own goodput on random runs; the written questions record answers without grading them."""

from __future__ import annotations

import random

import pytest

from minirunner.tools.bench.serve import RequestFuncOutput, calculate_metrics
from simulators.exercises import NotImplementedYet
from simulators.serving_exercises import (
    goodput_task,
    make_capacity_exercise,
    make_chunk_exercise,
    make_knee_exercise,
    reference_goodput,
    written_question,
)
from simulators.serving_instructor import GOODPUT_VALID, GOODPUT_WRONG, RUBRICS
from simulators.serving_model import StepTime, capacity

SEEDS = range(12)


def _unanswered_without_the_method(ex):
    v = ex.check(None)
    assert not v.answered and "hint" in v.why and ex.exercise.hint not in v.why


@pytest.mark.parametrize("seed", SEEDS)
def test_capacity_exercise(seed):
    ex = make_capacity_exercise(seed)
    sol = ex.solution()
    assert ex.check(sol).correct and ex.check(str(sol * 1.01)).correct
    wrong = ex.check(sol / 2)
    assert not wrong.correct and ex.exercise.hint in wrong.why  # the hint comes after a wrong attempt
    assert "prefill" in ex.check(sol * 1.5).why or not ex.check(sol * 1.5).correct
    _unanswered_without_the_method(ex)


def test_capacity_exercise_names_the_mistakes():
    ex = make_capacity_exercise(3)
    q = ex.question
    # rebuild the numbers from the question: alpha, beta, gamma in ms, then S, P, O
    import re
    a, b, g = (float(x) * 1e-3 for x in re.findall(r"= ([\d.]+) ms", q))
    p, o = (int(x) for x in re.findall(r"a (\d+)-token prompt and generates (\d+)", q)[0])
    s = int(re.findall(r"max_num_seqs = (\d+)", q)[0])
    step = StepTime(a, b, g)
    assert ex.solution() == pytest.approx(capacity(step, p, o, s))
    assert "prefill" in ex.check(s / (o * a + (o - 1) * b * s)).why
    assert "one seat" in ex.check(ex.solution() / s).why
    assert "tokens per second" in ex.check(ex.solution() * o).why


@pytest.mark.parametrize("seed", SEEDS)
def test_knee_exercise(seed):
    ex = make_knee_exercise(seed)
    sol = ex.solution()
    assert ex.check(sol).correct and ex.check(sol.upper() + ") because").correct
    others = [c for c in "abcd" if c != sol]
    assert all(not ex.check(c).correct for c in others)
    assert not ex.check("e").correct
    _unanswered_without_the_method(ex)
    assert "p50 TTFT grows a lot" in ex.question  # the right option is always on offer


def test_knee_exercise_shuffles_its_options():
    assert len({make_knee_exercise(s).solution() for s in range(20)}) > 1


@pytest.mark.parametrize("seed", SEEDS)
def test_chunk_exercise(seed):
    ex = make_chunk_exercise(seed)
    sol = ex.solution()
    assert ex.check(sol).correct and ex.check(f"{sol:.3f}").correct
    assert not ex.check(sol * 2).correct and not ex.check(-1).correct
    _unanswered_without_the_method(ex)


def test_chunk_exercise_names_the_mistakes():
    for seed in SEEDS:
        ex = make_chunk_exercise(seed)
        import re
        a, b, g = (float(x) * 1e-3 for x in re.findall(r"= ([\d.]+) ms", ex.question))
        found = re.findall(r"(\d+) requests are decoding when a (\d+)-token", ex.question)
        d, prompt = (int(x) for x in found[0])
        budget = int(re.findall(r"max_num_batched_tokens = (\d+)", ex.question)[0])
        step = StepTime(a, b, g)
        assert ex.solution() == pytest.approx(step(d, budget - d) * 1e3)
        assert "chunks" in ex.check(step(d, prompt) * 1e3).why
        assert "decode tokens count" in ex.check(step(d, budget) * 1e3).why


# --- the goodput implement-it -------------------------------------------------------------------

def _measured_like(seed: int) -> dict:
    """A run as bench serve reports it, with bench serve's own goodput (vLLM's request_goodput, from its
    calculate_metrics) as the figure."""
    rng = random.Random(seed)
    outputs = []
    for _ in range(rng.randint(10, 40)):
        n = rng.choice([1, 2, 5, 30])
        o = RequestFuncOutput(prompt_len=8, output_tokens=n, ttft=rng.uniform(0.01, 0.3),
                              itl=[rng.uniform(0.001, 0.02) for _ in range(n - 1)], success=True)
        o.latency = o.ttft + sum(o.itl) + rng.uniform(0, 0.002)
        if rng.random() < 0.1:
            o = RequestFuncOutput(prompt_len=8, error="HTTP 503: busy")
        outputs.append(o)
    duration = rng.uniform(1.0, 3.0)
    s = calculate_metrics(outputs, duration, goodput={"ttft": 150.0, "tpot": 12.0})
    # as minirunner.tools.serve_lab hands a run to the notebook: a failed request has no times
    reqs = [dict(prompt_tokens=o.prompt_len, output_tokens=o.output_tokens,
                 ttft=o.ttft if o.success else None, itl=o.itl, e2e=o.latency if o.success else None,
                 error=None if o.success else o.error) for o in outputs]
    return dict(requests=reqs, duration=duration, slo_ttft=0.15, slo_tpot=0.012, goodput=s["request_goodput"])


@pytest.mark.parametrize("seed", range(30))
def test_the_reference_is_bench_serves_goodput(seed):
    run = _measured_like(seed)
    assert reference_goodput(run["requests"], run["duration"], run["slo_ttft"], run["slo_tpot"]) \
        == pytest.approx(run["goodput"], rel=1e-12)


MEASURED = [_measured_like(s) for s in range(3)]


def test_goodput_checker_accepts_the_reference():
    assert goodput_task(MEASURED).check(reference_goodput).correct


@pytest.mark.parametrize("name", sorted(GOODPUT_VALID))
def test_goodput_checker_accepts_each_valid_alternative(name):
    v = goodput_task(MEASURED).check(GOODPUT_VALID[name])
    assert v.correct, v.why


@pytest.mark.parametrize("name", sorted(GOODPUT_WRONG))
def test_goodput_checker_rejects_each_known_wrong_solution(name):
    for seed in (0, 1, 2):  # whatever the seed, the seeded runs reach every rule
        v = goodput_task(MEASURED, seed=seed).check(GOODPUT_WRONG[name])
        assert v.answered and not v.correct, (name, seed)
        assert "Hint:" in v.why


def test_goodput_checker_on_a_stub_and_a_crash():
    def stub(requests, duration, slo_ttft, slo_tpot):
        raise NotImplementedYet

    v = goodput_task().check(stub)
    assert not v.answered and str(v).startswith("not implemented yet") and "Hint" not in v.why

    def crash(requests, duration, slo_ttft, slo_tpot):
        return sum(r["ttft"] <= slo_ttft for r in requests) / duration  # None for a failed request

    v = goodput_task().check(crash)
    assert v.answered and not v.correct and "TypeError" in v.why


def test_the_measured_figure_is_what_counts():
    run = dict(MEASURED[0])
    run["goodput"] += 0.5  # a load generator that reported another figure
    assert not goodput_task([run]).check(reference_goodput).correct


def test_written_questions_record_and_never_grade():
    for n in (1, 2):
        q = written_question(n)
        assert "not answered yet" in str(q.check("")) and not q.check(None).answered
        v = q.check("the knee moved from 8 to 13 requests/s because ...")
        assert v.answered and str(v).startswith("recorded") and "right" not in str(v)
        assert len(RUBRICS[n]) >= 4
        assert not any(line[:40] in q.question for line in RUBRICS[n])  # the rubric is not in the question
    with pytest.raises(ValueError):
        written_question(3)

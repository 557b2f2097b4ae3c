"""The exercises of notebooks 04 and 05: each checker accepts the reference answer, says "not
answered/implemented yet" to an untouched stub, and rejects known-wrong answers and implementations."""

from __future__ import annotations

import bisect
import re

import pytest

from minirunner.worker.cudagraph import bucket_for
from simulators.buckets import padded_batch_size
from simulators.exercises import NotImplementedYet
from simulators.graph_exercises import (
    CAPTURE_SNIPPETS,
    expected_padding_rows,
    make_bucket_task,
    make_capture_exercise,
    make_ladder_exercise,
    make_padding_row_exercise,
)
from simulators.launch_problems import make_step_time_task

SEEDS = range(6)


def _eager_by_hand(kernel_us, launch_us, host_other_us):
    # written from the rule, not from the simulator: operator i is issued at other + (i + 1) * launch
    # and starts when it is issued and the previous one has ended
    device = 0.0
    for i, k in enumerate(kernel_us):
        device = max(host_other_us + (i + 1) * launch_us, device) + k
    return device


def test_step_time_task_accepts_the_rule_and_rejects_wrong_ones():
    task = make_step_time_task()
    assert task.check(_eager_by_hand).correct

    def stub(kernel_us, launch_us, host_other_us):
        raise NotImplementedYet

    pending = task.check(stub)
    assert not pending.answered and "not implemented yet" in str(pending)
    assert "wrong" not in str(pending)
    wrong = {
        "serial sum": lambda kernel_us, launch_us, host_other_us:
            host_other_us + len(kernel_us) * launch_us + sum(kernel_us),
        "max of totals": lambda kernel_us, launch_us, host_other_us:
            max(host_other_us + len(kernel_us) * launch_us, sum(kernel_us)),
        "forgets the other host work": lambda kernel_us, launch_us, host_other_us:
            _eager_by_hand(kernel_us, launch_us, 0.0),
    }
    for name, fn in wrong.items():
        verdict = task.check(fn)
        assert verdict.answered and not verdict.correct, name
        assert "expected" in verdict.why


def _bisect_bucket(batch_size, sizes):
    i = bisect.bisect_left(sorted(sizes), batch_size)
    return sorted(sizes)[i] if i < len(sizes) else None


def test_bucket_task_uses_the_runner_reference_and_rejects_wrong_pickers():
    task = make_bucket_task(bucket_for)
    assert task.check(_bisect_bucket).correct
    assert task.check(lambda batch_size, sizes: padded_batch_size(batch_size, sizes)).correct

    def stub(batch_size, sizes):
        raise NotImplementedYet

    assert not task.check(stub).answered
    wrong = {
        "rounds down": lambda batch_size, sizes: max((s for s in sizes if s <= batch_size), default=None),
        "largest always": lambda batch_size, sizes: sizes[-1] if batch_size <= sizes[-1] else None,
        "strictly greater": lambda batch_size, sizes: next((s for s in sizes if s > batch_size), None),
        "never eager": lambda batch_size, sizes: next((s for s in sizes if s >= batch_size), sizes[-1]),
    }
    for name, fn in wrong.items():
        verdict = task.check(fn)
        assert verdict.answered and not verdict.correct, name


@pytest.mark.parametrize("seed", SEEDS)
def test_capture_exercise(seed):
    ex = make_capture_exercise(seed)
    solution = ex.solution()
    assert ex.check(solution).correct
    assert not ex.check(None).answered
    # every letter in the solution is a line that needs the host or a shape from the data
    breaking = {text for text, breaks, _ in CAPTURE_SNIPPETS if breaks}
    lines = {line.split(") ", 1)[0].strip(" ("): line.split(") ", 1)[1]
             for line in ex.question.splitlines() if line.startswith("  (")}
    assert {c for c in lines if lines[c] in breaking} == set(solution)
    assert not ex.check("abcde").correct  # everything
    fine = sorted(set(lines) - set(solution))
    assert not ex.check(fine[0]).correct and "capturable" in ex.check(solution + fine[0]).why
    if len(solution) > 1:
        assert "does break it" in ex.check(solution[0]).why


@pytest.mark.parametrize("seed", SEEDS)
def test_padding_row_exercise(seed):
    ex = make_padding_row_exercise(seed)
    safe = ex.solution()
    assert ex.check(safe).correct and not ex.check(None).answered
    line = next(x for x in ex.question.splitlines() if x.startswith(f"  ({safe})"))
    assert "slot -1" in line and "seq_len 0" in line and "token id 0" in line
    wrong = [c for c in "abcd" if c != safe]
    assert len(wrong) == 3 and not any(ex.check(c).correct for c in wrong)


def test_expected_padding_rows_by_hand():
    # half the steps at batch 3 (bucket 4: 1 row), half at 17 (bucket 24: 7 rows) -> 4 rows per step
    assert expected_padding_rows({3: 0.5, 17: 0.5}, [1, 2, 4, 8, 16, 24, 32]) == 4.0
    assert expected_padding_rows({3: 1, 17: 1}, [3, 17]) == 0.0
    assert expected_padding_rows({40: 1.0}, [1, 2, 4]) == 0.0  # above the ladder: eager, unpadded


@pytest.mark.parametrize("seed", SEEDS)
def test_ladder_exercise(seed):
    ex = make_ladder_exercise(seed)
    best = ex.solution()
    assert ex.check(best).correct and not ex.check(None).answered
    others = [c for c in "abc" if c != best]
    assert not ex.check(others[0]).correct and not ex.check(others[1]).correct
    assert "rows per step" in ex.check(others[0]).why


@pytest.mark.parametrize("seed", SEEDS)
def test_hints_come_only_after_a_wrong_attempt(seed):
    from simulators.hinted_exercises import hinted
    from simulators.launch_problems import make_remedy_exercise, make_step_exercise

    for make in (make_padding_row_exercise, make_ladder_exercise, make_capture_exercise, make_step_exercise,
                 make_remedy_exercise):
        raw = make(seed)
        ex = hinted(raw)
        pending = ex.check(None)
        assert not pending.answered and raw.hint not in str(pending) and "wrong:" not in str(pending)
        wrong = next(c for c in ("a", "b", "c", "d", "abcde", 1e9)
                     if raw.check(c).attempt and not raw.check(c).correct)
        verdict = ex.check(wrong)
        wrong_form = "a" if isinstance(raw.solution(), float) else "?"
        assert not ex.check(wrong_form).answered  # an answer of the wrong form gets no hint
        assert verdict.answered and not verdict.correct and f"Hint: {raw.hint}" in verdict.why
        assert ex.check(raw.solution()).correct


@pytest.mark.parametrize("seed", SEEDS)
def test_multiple_choice_states_no_premise_and_gives_options_one_format(seed):
    from simulators.launch_problems import make_remedy_exercise

    assert "bound" not in make_remedy_exercise(seed).question  # deciding host/device-bound is the exercise
    question = make_padding_row_exercise(seed).question
    options = [line for line in question.splitlines() if line.startswith("  (")]
    # every candidate row names the same four fields, in the same order, and nothing else
    row = re.compile(r"  \([a-d]\) slot -?\d+, seq_len \d+, block-table row \[[\d, ]+\], token id -?\d+")
    assert all(row.fullmatch(o) for o in options), options

"""Notebook 05's implement-it: capture and replay a toy decode step over static buffers with padding rows,
checked against the runner's own buffer writes (``StepBuffers.put_graph_rows`` + ``write_uniform``). The
checker accepts a solution written from the rule, says "not implemented yet" (with no method) to a stub,
and rejects each known-wrong solution, the hint coming only after the wrong attempt."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minirunner.worker.buffers import StepBuffers
from simulators.exercises import NotImplementedYet
from simulators.graph_replay import BUFFERS, make_replay_task
from simulators.hinted_exercises import hinted
from tests.course_mutants.nb05 import REPLAY_SOURCE


def runner_rows(ids, positions, tables, bucket, block_size, width):
    # the runner's own writes for a graph step of `bucket` rows (the notebook passes the same adapter)
    sb = StepBuffers(torch.device("cpu"), bucket, bucket, width, block_size)
    t = np.zeros((len(ids), width), np.int32)
    for r, row in enumerate(tables):
        t[r, :len(row)] = row
    sb.put_graph_rows(t, None, bucket)
    n = len(ids)
    sb.write_uniform(bucket, n, torch.tensor(ids).view(n, 1), torch.tensor(positions).view(n, 1))
    return {name: getattr(sb, name)[:bucket].numpy().copy() for name in BUFFERS}


_namespace: dict = {}
exec(REPLAY_SOURCE, _namespace)  # the rule with knobs, each a known mistake when set
_solution = _namespace["_replay"]


@pytest.fixture(scope="module")
def task():
    return make_replay_task(runner_rows)


def test_accepts_the_rule(task):
    assert task.check(_solution).correct


def test_grades_the_property_not_the_runners_rows(task):
    """A valid choice the runner does not make: only a row's own table columns written (the columns past
    its blocks are never read)."""
    assert task.check(lambda **a: _solution(**a, full_width=False)).correct


def test_a_stub_is_not_implemented_yet_without_the_method(task):
    def stub(graphs, buffers, ids, positions, tables, block_size):
        raise NotImplementedYet

    verdict = hinted(task).check(stub)
    assert not verdict.answered and str(verdict).startswith("not implemented yet")
    assert "padding" not in str(verdict) and "wrong:" not in str(verdict)


@pytest.mark.parametrize("name, kw, says", [
    ("leaves padding rows stale", {"pad": False}, "rows"),
    ("pads with slot 0", {"pad_slot": 0}, "slot_mapping"),
    ("rebinds the buffers", {"in_place": False}, "new array"),
    ("seq_len = position", {"seq_offset": 0}, "seq_lens"),
    ("always the largest graph", {"bucket_rule": lambda n, sizes: sizes[-1]}, "replayed"),
])
def test_rejects_a_known_wrong_solution_and_then_hints(task, name, kw, says):
    verdict = hinted(task).check(lambda **a: _solution(**a, **kw))
    assert verdict.answered and not verdict.correct, name
    assert says in verdict.why and "Hint:" in verdict.why, verdict.why


def test_the_cases_shrink_so_a_padded_bucket_follows_a_larger_batch(task):
    shrinks = [any(len(b["ids"]) < len(a["ids"]) for a, b in zip(run, run[1:], strict=False))
               for run in task.cases]
    assert all(shrinks)

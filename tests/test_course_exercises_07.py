"""Notebook 07's checkers: each accepts its reference answer and rejects known-wrong ones; the
persistent-rows model agrees with the runner's RequestStateRows; the slot-mapping task accepts the
runner's twin and rejects wrong gathers."""

from __future__ import annotations

import pytest
import torch

from minirunner.core.sched.output import NewRequestData
from minirunner.kernels.input_prep import prepare_inputs_ref
from minirunner.kv.block_table import BlockTable
from minirunner.sampling_params import SamplingParams
from minirunner.worker.states import RequestStateRows
from simulators.exercises import NotImplementedYet
from simulators.runner_v2 import (
    PersistentRows,
    compaction_moves,
    host_share,
    make_gain_exercise,
    make_idx_mapping_exercise,
    make_meaning_exercise,
    make_slot_mapping_task,
    runner_gain,
)

SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_gain_exercise(seed):
    ex = make_gain_exercise(seed)
    sol = ex.solution()
    assert ex.check(sol).correct and ex.check(f"{sol * 100:.2f}%").correct
    assert not ex.check(sol + 1).correct                      # the factor, not the fraction
    assert not ex.check(sol / (1 + sol)).correct              # the host share
    assert not ex.check(None).answered


@pytest.mark.parametrize("seed", SEEDS)
def test_idx_mapping_exercise(seed):
    ex = make_idx_mapping_exercise(seed)
    sol = ex.solution()
    assert ex.check(sol).correct
    assert not ex.check(list(range(len(sol)))).correct or sol == list(range(len(sol)))  # compacted
    assert not ex.check(sol[::-1]).correct or sol == sol[::-1]
    assert not ex.check([x + 1 for x in sol]).correct
    assert not ex.check("x").correct
    assert not ex.check(None).answered


@pytest.mark.parametrize("seed", SEEDS)
def test_meaning_exercise(seed):
    ex = make_meaning_exercise(seed)
    sol = ex.solution()
    assert ex.check(sol).correct and ex.check(sol.upper()).correct
    wrong = [m for m in ("kernel", "abstraction", "memory model") if m != sol]
    assert all(not ex.check(w).correct for w in wrong)
    assert not ex.check("paging").correct
    assert not ex.check(None).answered


def _sync(state, rid, table, sent):
    """The runner's row of ``rid``, its block ids sent as the scheduler sends them (data)."""
    row = state.row_of.get(rid)
    if row is None:
        row = state.add(NewRequestData(rid, [], SamplingParams(temperature=1.0), 0, list(table.blocks), 0))
    else:
        state.write_blocks(row, list(table.blocks[sent.get(rid, 0):]))
    sent[rid] = len(table.blocks)
    return row


def _table(*blocks):
    t = BlockTable(block_size=4)
    t.blocks.extend(blocks)
    return t


@pytest.mark.parametrize("seed", range(20))
def test_persistent_rows_model_agrees_with_the_runner(seed):
    import random
    rng = random.Random(seed)
    state, model = RequestStateRows(capacity=8, max_blocks=2), PersistentRows(capacity=8)
    running: list[str] = []
    tables, sent = {}, {}
    for n in range(30):
        if running and (len(running) == 8 or rng.random() < 0.4):
            gone = running.pop(rng.randrange(len(running)))
            state.release(gone)
            sent.pop(gone)
            model.finish(gone)
        else:
            rid = f"r{n}"
            running.append(rid)
            tables[rid] = _table(n)
        batch = rng.sample(running, len(running))
        assert [_sync(state, r, tables[r], sent) for r in batch] == model.idx_mapping(batch)


def test_staged_write_moves_only_new_ids():
    state = RequestStateRows(capacity=2, max_blocks=4)
    t, sent = _table(3, 5), {}
    _sync(state, "a", t, sent)
    t.blocks.append(9)
    before = state.num_written.copy()
    row = _sync(state, "a", t, sent)
    assert int(state.num_written[row] - before[row]) == 1
    assert state.block_tables[row, :3].tolist() == [3, 5, 9]


def test_gain_bounds():
    assert runner_gain(100, 400) == pytest.approx(0.25)
    assert runner_gain(100, 400, overlapped=True) == 0.0
    assert runner_gain(500, 400, overlapped=True) == pytest.approx(0.25)
    assert host_share(100, 400) == pytest.approx(0.2)
    assert compaction_moves("ABCD", "A") == 3 and compaction_moves("ABCD", "D") == 0
    with pytest.raises(ValueError):
        runner_gain(1, 0)


def _twin_slots(block_tables, idx_mapping, num_computed, query_lens, block_size):
    tables = torch.tensor(block_tables, dtype=torch.int32)
    n, T = len(idx_mapping), sum(query_lens)
    i32, i64 = torch.int32, torch.int64
    out = dict(positions=torch.zeros(T, dtype=i64), slot_mapping=torch.zeros(T, dtype=i64),
               seq_lens=torch.zeros(n, dtype=i32), query_start_loc=torch.zeros(n + 1, dtype=i32))
    prepare_inputs_ref(torch.tensor(idx_mapping, dtype=i32), torch.tensor(query_lens, dtype=i32),
                       torch.tensor(num_computed, dtype=i32), tables, block_size, **out)
    return out["slot_mapping"].tolist()


def _reference_solution(block_tables, idx_mapping, num_computed, query_lens, block_size):
    out = []
    for row, q in zip(idx_mapping, query_lens, strict=True):
        for j in range(q):
            pos = num_computed[row] + j
            out.append(block_tables[row][pos // block_size] * block_size + pos % block_size)
    return out


def test_slot_mapping_task():
    task = make_slot_mapping_task(_twin_slots, seed=7)
    assert task.check(_reference_solution).correct

    def batch_order(block_tables, idx_mapping, num_computed, query_lens, block_size):  # ignores idx_mapping
        return _reference_solution(block_tables, list(range(len(idx_mapping))), num_computed, query_lens,
                                   block_size)

    def block_index(block_tables, idx_mapping, num_computed, query_lens, block_size):  # forgets the table
        return [s - s // block_size * block_size + (s // block_size) for s in
                _reference_solution(block_tables, idx_mapping, num_computed, query_lens, block_size)]

    def from_zero(block_tables, idx_mapping, num_computed, query_lens, block_size):  # ignores cached tokens
        return _reference_solution(block_tables, idx_mapping, [0] * len(num_computed), query_lens, block_size)

    for wrong in (batch_order, block_index, from_zero):
        v = task.check(wrong)
        assert v.answered and not v.correct

    def stub(**_):
        raise NotImplementedYet

    v = task.check(stub)
    assert not v.answered and "not implemented yet" in str(v)

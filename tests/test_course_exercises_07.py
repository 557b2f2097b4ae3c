"""Notebook 07's checkers: each accepts its reference answer and rejects known-wrong ones; the
persistent-rows model agrees with the runner's RequestStateRows; the models of vLLM V1's batch follow
its condense and reorder rules; the staged-rows task grades properties: it accepts the runner's own rows
and any valid free-list order (FIFO, stack, lowest first) and rejects rows shared, leaked or moved and
diffs that send too much or too little; the pinned-buffer race task accepts the runner's
fresh-pinned-block rule and a ring deep enough for the lag, and rejects the race, a too-shallow ring,
the barrier and pageable copies."""

from __future__ import annotations

import numpy as np
import pytest

from minirunner.core.sched.output import NewRequestData
from minirunner.kv.block_table import BlockTable
from minirunner.sampling_params import SamplingParams
from minirunner.worker.states import RequestStateRows
from simulators.exercises import NotImplementedYet
from simulators.runner_v2 import (
    PersistentRows,
    host_share,
    make_gain_exercise,
    make_idx_mapping_exercise,
    make_meaning_exercise,
    runner_gain,
    v1_admit_and_condense,
    v1_reorder_swaps,
)
from simulators.runner_v2_exercises import race_task, run_steps, staged_rows_task

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
    with pytest.raises(ValueError):
        runner_gain(1, 0)


def test_v1_condense_moves_one_row_per_hole_and_none_when_an_admission_fills_it():
    # vllm/v1/worker/gpu_input_batch.py InputBatch.condense: the last live row goes into the hole
    assert v1_admit_and_condense("ABCD", ["B"], []) == (list("ADC"), [(3, 1)])
    assert v1_admit_and_condense("ABCD", ["B"], ["E"]) == (list("AECD"), [])
    assert v1_admit_and_condense("ABCD", ["D"], []) == (list("ABC"), [])  # the last row leaves no hole
    assert v1_admit_and_condense("ABCDEF", ["A", "C"], []) == (list("FBED"), [(5, 0), (4, 2)])
    assert v1_admit_and_condense("ABC", [], ["D", "E"]) == (list("ABCDE"), [])


def test_v1_reorder_puts_decodes_first_with_the_fewest_swaps():
    # vllm/v1/attention/backends/utils.py reorder_batch_to_split_decodes_and_prefills
    assert v1_reorder_swaps([True, False, True, True]) == [(1, 3)]
    assert v1_reorder_swaps([False, False, True, True]) == [(0, 3), (1, 2)]
    assert v1_reorder_swaps([True, True, False]) == []
    for seed in range(30):
        import random
        kinds = [random.Random(seed).random() < 0.6 for _ in range(8)]
        rows = list(kinds)
        for a, b in v1_reorder_swaps(kinds):
            rows[a], rows[b] = rows[b], rows[a]
        assert rows == sorted(rows, reverse=True)  # every decode ahead of every prefill


# --- staged rows: the runner's RequestStateRows behind the exercise's interface -------------------

class RunnerRows:
    def __init__(self, capacity, width):
        self.rows = RequestStateRows(capacity, width)
        self.rows.record_writes()
        self.sent = {}  # request id -> the block ids the rows hold, as the scheduler tracks them

    def sync(self, request_id, blocks):
        row = self.rows.row_of.get(request_id)
        if row is None:
            row = self.rows.add(NewRequestData(request_id, [], SamplingParams(temperature=1.0), 0,
                                               list(blocks), 0))
        else:
            held = self.sent[request_id]
            if held == blocks[:len(held)]:  # grown: only the new ids travel
                self.rows.write_blocks(row, list(blocks[len(held):]))
            else:  # re-allocated: the whole table is sent again
                self.rows.write_blocks(row, list(blocks), replace=True)
        self.sent[request_id] = list(blocks)
        return row

    def release(self, request_id):
        self.rows.release(request_id)
        self.sent.pop(request_id, None)

    def pack(self):
        cells, blocks = self.rows.drain_writes()
        return np.concatenate([cells, blocks.astype(np.int64)])

    def apply(self, mirror, packed):
        m = len(packed) // 2
        mirror[packed[:m]] = packed[m:]


class StudentRows:
    """A student's solution, with switches for the known mistakes."""

    def __init__(self, capacity, width, order="stack", resend=False, keep=False, no_rewrite=False,
                 compact=False, leak=False, live=False):
        self.width, self.order, self.resend, self.keep = width, order, resend, keep
        self.no_rewrite, self.compact, self.leak, self.live = no_rewrite, compact, leak, live
        self.free = list(range(capacity - 1, -1, -1))
        self.row_of, self.written, self.pending, self.next_row = {}, {}, [], 0

    def _take(self):
        if self.leak:  # never reuses a row: runs out
            self.next_row += 1
            return self.next_row - 1
        if self.live:  # the number of rows in use: a live row once a lower one was freed
            return len(self.row_of)
        if self.order == "fifo":
            return self.free.pop(0)
        if self.order == "lowest":
            row = min(self.free)
            self.free.remove(row)
            return row
        return self.free.pop()

    def sync(self, request_id, blocks):
        if self.compact:  # rows follow the order requests were first seen, renumbered: V1-style
            order = [r for r in self.row_of if r != request_id] + [request_id]
            self.row_of = {r: i for i, r in enumerate(order)}
            self.written.setdefault(request_id, [])
        if request_id not in self.row_of:
            self.row_of[request_id] = self._take()
            self.written[request_id] = []
        row, done = self.row_of[request_id], self.written[request_id]
        start = 0 if self.resend or (done != blocks[:len(done)] and not self.no_rewrite) else len(done)
        for col in range(start, len(blocks)):
            self.pending.append((row * self.width + col, blocks[col]))
        self.written[request_id] = list(blocks)
        return row

    def release(self, request_id):
        self.free.append(self.row_of.pop(request_id))
        self.written.pop(request_id, None)

    def pack(self):
        cells = [c for c, _ in self.pending] + [b for _, b in self.pending]
        if not self.keep:
            self.pending = []
        return np.array(cells, dtype=np.int64)

    def apply(self, mirror, packed):
        m = len(packed) // 2
        mirror[packed[:m]] = packed[m:]


@pytest.mark.parametrize("seed", range(6))
def test_staged_rows_task_accepts_the_runner_and_any_free_list_order(seed):
    task = staged_rows_task(seed=seed)
    assert task.check(RunnerRows).correct
    for order in ("stack", "fifo", "lowest"):
        verdict = task.check(lambda c, w, order=order: StudentRows(c, w, order=order))
        assert verdict.correct, (order, str(verdict))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mistake", ["resend", "keep", "no_rewrite", "compact", "leak", "live"])
def test_staged_rows_task_rejects_known_mistakes_and_hints_only_then(mistake, seed):
    task = staged_rows_task(seed=seed)
    verdict = task.check(lambda c, w: StudentRows(c, w, **{mistake: True}))
    assert verdict.answered and not verdict.correct and "Hint:" in verdict.why


def test_staged_rows_facts_come_from_the_script_not_an_allocator():
    """The cells a step may send: a new table whole, a grown one its new ids, a replaced one whole."""
    from simulators.runner_v2_exercises import rows_facts

    script = [dict(finished=[], batch=[("a", [1, 2]), ("b", [3])]),
              dict(finished=[], batch=[("a", [1, 2, 4]), ("b", [3])]),
              dict(finished=["a"], batch=[("b", [7, 8, 9]), ("c", [5])])]
    assert rows_facts(4, 4, script)["bounds"] == [3, 1, 4]


def test_staged_rows_stub_is_not_implemented_yet_without_the_algorithm():
    class Stub:
        def __init__(self, capacity, width):
            raise NotImplementedYet

    verdict = staged_rows_task().check(Stub)
    assert not verdict.answered and "not implemented yet" in str(verdict) and "stack" not in str(verdict)


# --- the pinned-buffer race ---------------------------------------------------------------------

def fresh_pinned(host, stream, pool, state):  # minirunner/worker/buffers.py to_device: a fresh pinned copy
    stream.copy_async(pool.pin_memory(host))


def one_pinned_buffer(host, stream, pool, state):  # V1's reused pinned buffer without its barrier: the race
    buf = state.setdefault("buf", pool.empty(len(host)))
    buf[:] = host
    stream.copy_async(buf)


def barrier(host, stream, pool, state):  # V1's fix: wait for the last copy before writing again
    buf = state.setdefault("buf", pool.empty(len(host)))
    stream.synchronize()
    buf[:] = host
    stream.copy_async(buf)


def pageable(host, stream, pool, state):  # a copy from unpinned memory cannot run ahead
    stream.copy_async(host.copy())


def two_buffers(host, stream, pool, state):  # round robin over too few buffers for the device's lag
    bufs = state.setdefault("bufs", [pool.empty(len(host)), pool.empty(len(host))])
    state["i"] = state.get("i", 0) + 1
    buf = bufs[state["i"] % 2]
    buf[:] = host
    stream.copy_async(buf)


def test_the_race_is_real_in_the_model():
    steps = [np.full(3, i) for i in range(5)]
    delivered, stream = run_steps(one_pinned_buffer, steps, lag=2)
    assert [int(d[0]) for d in delivered] != list(range(5))  # copies read later values
    delivered, stream = run_steps(fresh_pinned, steps, lag=2)
    assert [int(d[0]) for d in delivered] == list(range(5)) and stream.host_waits == 0


def ring(depth):
    def launch(host, stream, pool, state):  # vLLM's UvaBufferPool: rotate `depth` pinned buffers
        bufs = state.setdefault("bufs", [pool.empty(len(host)) for _ in range(depth)])
        state["i"] = state.get("i", -1) + 1
        buf = bufs[state["i"] % depth]
        buf[:] = host
        stream.copy_async(buf)
    return launch


def test_race_task_accepts_the_runner_rule_and_a_deep_enough_ring():
    assert race_task(fresh_pinned).check(fresh_pinned).correct
    assert race_task().check(fresh_pinned).correct  # the notebook's task carries no reference
    assert race_task().check(ring(3)).correct and race_task().check(ring(5)).correct
    assert not race_task().check(ring(2)).correct


@pytest.mark.parametrize("wrong", [one_pinned_buffer, barrier, pageable, two_buffers])
def test_race_task_rejects_the_race_the_barrier_and_pageable_copies(wrong):
    verdict = race_task(fresh_pinned).check(wrong)
    assert verdict.answered and not verdict.correct and "Hint:" in verdict.why


def test_race_stub_is_not_implemented_yet_without_the_fix():
    def stub(host, stream, pool, state):
        raise NotImplementedYet

    verdict = race_task(fresh_pinned).check(stub)
    assert not verdict.answered and "not implemented yet" in str(verdict) and "pinned" not in str(verdict)

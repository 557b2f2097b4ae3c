"""Notebook 07's implement-its: persistent state rows with a staged-write diff, and the pinned-buffer race.

Owns two teaching models and their checkers, which grade behaviour, never one implementation's
convention. Staged rows: a student's row allocator packs the block-table cells written since the last
step and applies them to a device mirror; on seeded step scripts no row may be shared or move while its
request runs, the mirror must hold every table, and a step may send no more cells than changed (any
free-list order passes). The race: a copy engine that runs a non-blocking host-to-device copy later than
the host issues it, reading the source only then, and pinned host memory handed out per copy as torch's
caching host allocator does; every copy must deliver its own step's values with no host wait. Each task
splits into a driver (runs the student's code, records data) and a judge (``rows_problem``,
``race_problem``), so the course's grader can run the first in the student's kernel and the second in
its own process. Pure numpy; never imports the runner.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simulators.exercises import Verdict
from simulators.hinted_exercises import HintedTask

__all__ = ["CopyStream", "PinnedPool", "drive_launch", "drive_rows", "race_task", "run_steps",
           "staged_rows_task"]


# ---------------------------------------------------------------------------------------------
# Staged rows: sync (a row per request, only new block ids written), pack (the diff), apply (scatter)

def _scripts(seed: int, capacity: int, width: int, num_steps: int = 9) -> list[list[dict]]:
    """Seeded step scripts: each step finishes some requests, then runs a batch of (request, block ids),
    tables growing by a block now and then, sometimes replaced whole (a preemption re-allocates)."""
    rng = random.Random(seed)
    scripts = []
    for _ in range(4):
        next_block, running, tables, steps = 100, [], {}, []
        for n in range(num_steps):
            finished = [r for r in running if rng.random() < 0.25]
            running = [r for r in running if r not in finished]
            while len(running) < capacity and rng.random() < 0.6:
                rid = f"r{n}{len(running)}"
                running.append(rid)
                tables[rid] = []
            for rid in running:
                if not tables[rid] or (len(tables[rid]) < width and rng.random() < 0.4):
                    tables[rid] = tables[rid] + [next_block]
                    next_block += 1
                elif rng.random() < 0.1:  # preempted and re-admitted: a new table, new blocks
                    tables[rid] = list(range(next_block, next_block + rng.randint(1, width)))
                    next_block += width
            batch = rng.sample(running, len(running))
            steps.append(dict(finished=finished, batch=[(r, list(tables[r])) for r in batch]))
        scripts.append(steps)
    return scripts


def rows_cases(seed: int, capacity: int = 4, width: int = 4) -> list[dict]:
    """The staged-rows task's cases: keyword arguments of ``drive_rows`` (plain data)."""
    return [dict(capacity=capacity, width=width, script=s) for s in _scripts(seed, capacity, width)]


def drive_rows(cls, capacity: int, width: int, script: list[dict]) -> list[dict]:
    """Run ``cls(capacity, width)`` on one step script and write down, as data, what it did: per step
    the rows ``sync`` returned (batch order), the number of cells ``pack`` sent and the device mirror
    after ``apply``. It judges nothing (``rows_problem`` does); it runs where the class lives."""
    rows_obj = cls(capacity, width)
    mirror = np.zeros(capacity * width, dtype=np.int32)
    out = []
    for step in script:
        for rid in step["finished"]:
            rows_obj.release(rid)
        rows = [rows_obj.sync(rid, list(blocks)) for rid, blocks in step["batch"]]
        packed = np.asarray(rows_obj.pack())
        if packed.ndim != 1 or len(packed) % 2:
            raise ValueError(f"pack() returned shape {packed.shape}: give one flat array, m cells then m ids")
        rows_obj.apply(mirror, packed)
        out.append(dict(rows=[int(r) for r in rows], cells=len(packed) // 2, mirror=mirror.tolist()))
    return out


def rows_facts(capacity: int, width: int, script: list[dict]) -> dict:
    """What any correct answer must respect on one script, from the script alone (no allocator): the
    most cells each step needs to send (a new or re-allocated table whole, a grown one its new ids)."""
    held: dict[str, list[int]] = {}
    bounds = []
    for step in script:
        for rid in step["finished"]:
            held.pop(rid, None)
        need = 0
        for rid, blocks in step["batch"]:
            old = held.get(rid)
            grown = old is not None and list(blocks[:len(old)]) == old
            need += len(blocks) - len(old) if grown else len(blocks)
            held[rid] = list(blocks)
        bounds.append(need)
    return dict(capacity=capacity, width=width, script=script, bounds=bounds)


def rows_problem(got: list[dict], facts: dict) -> str | None:
    """The first property a run of ``drive_rows`` breaks, in words; None when it keeps them all: every
    row in range, no row handed to two live requests, a request keeping its row while it runs, the
    mirror holding each request's table in its row, and no more cells sent than the step needs. Any
    free-list order passes (FIFO, stack, lowest first)."""
    capacity, width, script = facts["capacity"], facts["width"], facts["script"]
    if len(got) != len(script):
        return f"{len(got)} steps recorded for {len(script)}"
    row_of: dict[str, int] = {}
    for n, (step, rec, bound) in enumerate(zip(script, got, facts["bounds"], strict=True)):
        where = f"step {n}"
        for rid in step["finished"]:
            row_of.pop(rid, None)
        batch = [rid for rid, _ in step["batch"]]
        rows = rec["rows"]
        if len(rows) != len(batch):
            return f"{where}: {len(rows)} rows for a batch of {len(batch)}"
        for rid, row in zip(batch, rows, strict=True):
            if not 0 <= row < capacity:
                return (f"{where}: {rid} got row {row}, outside the {capacity} rows (are finished "
                        "requests' rows given back?)")
            if rid in row_of and row_of[rid] != row:
                return (f"{where}: {rid} moved from row {row_of[rid]} to row {row}: a running request keeps "
                        "its row")
            owner = next((r for r, w in row_of.items() if w == row and r != rid), None)
            if owner is not None:
                return f"{where}: {rid} got row {row}, which {owner} still holds"
            row_of[rid] = row
        mirror = rec["mirror"]
        for (rid, blocks), row in zip(step["batch"], rows, strict=True):
            held = mirror[row * width: row * width + len(blocks)]
            if held != list(blocks):
                return (f"{where}: the device mirror's row {row} ({rid}) holds {held}, its block table is "
                        f"{list(blocks)}")
        if rec["cells"] > bound:
            return f"{where}: sent {rec['cells']} cells where {bound} changed: send only what changed"
    return None


@dataclass
class StagedRowsTask:
    """Check a class ``cls(capacity, width)`` with ``sync(request_id, blocks) -> row``,
    ``release(request_id)``, ``pack() -> int64 [2m]`` (m flat cells row * width + column, then their m
    block ids; the cells written since the last pack) and ``apply(mirror, packed)`` (scatter into
    ``mirror``, the device's int32 [capacity * width]) on seeded step scripts, by its properties
    (``rows_problem``), not against one allocator: any order of free rows is right.

    For the course's grader: ``cases`` are ``drive_rows``'s keyword arguments, ``driver`` runs a class on
    one case where it lives, ``reference`` gives the facts a case must respect and ``same`` judges."""

    seed: int = 0
    capacity: int = 4
    width: int = 4
    name: str = "staged rows"
    driver: str = "simulators.runner_v2_exercises:drive_rows"
    judge: str = "simulators.runner_v2_exercises:rows_problem"  # the student release's check
    hint: str = ("rows: keep a free list (any order); a new request pops a free row and keeps it until "
                 "release, which gives it back; per row remember the block ids written; sync appends the "
                 "cells past that prefix, or writes the whole table again when the prefix no longer matches "
                 "(a re-allocated table); pack returns the cells pending since the last pack (row * width + "
                 "column, then the ids) and forgets them; apply is mirror[cells] = ids.")

    @property
    def cases(self) -> list[dict]:
        return rows_cases(self.seed, self.capacity, self.width)

    @staticmethod
    def reference(**case) -> dict:
        return rows_facts(**case)

    @staticmethod
    def same(got, facts) -> bool:
        return rows_problem(got, facts) is None

    @staticmethod
    def explain(got, facts) -> str:
        return rows_problem(got, facts) or "right"

    def check(self, cls) -> Verdict:
        cases = self.cases
        for s, case in enumerate(cases):
            try:
                problem = rows_problem(drive_rows(cls, **case), rows_facts(**case))
            except NotImplementedError:
                return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
            except Exception as e:  # a student's bug is a verdict, not a crash
                problem = f"raised {type(e).__name__}: {e}"
            if problem:
                return Verdict(False, f"script {s}, {problem}")
        return Verdict(True, f"rows never shared or moved, a correct mirror and only the changed cells sent, "
                             f"over {len(cases)} seeded scripts")


def staged_rows_task(seed: int = 0) -> HintedTask:
    """The implement-it, its hint shown only after a wrong attempt (no reference: it checks properties)."""
    return HintedTask(StagedRowsTask(seed=seed), name="staged rows",
                      prompt="write the class's methods and run the cell again "
                             "(a wrong attempt gets a hint).")


# ---------------------------------------------------------------------------------------------
# The pinned-buffer race: a host write racing a non-blocking copy

class PinnedPool:
    """Pinned (page-locked) host memory. ``empty(n)`` is ``torch.empty(n, pin_memory=True)`` and
    ``pin_memory(a)`` is ``Tensor.pin_memory()`` (a fresh pinned copy); torch's caching host allocator
    hands a block out again only after the copies reading it are done, so a fresh block per copy is safe.
    Counts the blocks allocated and the most read by copies in flight at once."""

    def __init__(self):
        self._blocks: list[np.ndarray] = []  # kept alive, so no other array can take a block's id
        self._pinned: set[int] = set()
        self.allocated = 0

    def empty(self, n: int, dtype=np.int64) -> np.ndarray:
        block = np.zeros(n, dtype=dtype)
        self._blocks.append(block)
        self._pinned.add(id(block))
        self.allocated += 1
        return block

    def pin_memory(self, array: np.ndarray) -> np.ndarray:
        block = self.empty(len(array), np.asarray(array).dtype)
        block[:] = array
        return block

    def is_pinned(self, array: np.ndarray) -> bool:
        return id(array) in self._pinned


class CopyStream:
    """A device's copy stream. ``copy_async(src)`` is ``dst.copy_(src, non_blocking=True)``: from pinned
    memory it is queued and the device reads ``src`` only when it gets to it (``device_runs``); from
    pageable memory the host must wait for everything queued and copy at once (a host wait).
    ``synchronize()`` waits for the queue (a host wait when anything was queued)."""

    def __init__(self, pool: PinnedPool):
        self.pool, self.queue, self.delivered = pool, [], []
        self.host_waits, self.peak_in_flight = 0, 0

    def copy_async(self, src: np.ndarray) -> None:
        if not self.pool.is_pinned(src):
            self.synchronize(force=True)
            self.delivered.append(np.array(src))
            return
        self.queue.append(src)  # a reference: the values are read later
        self.peak_in_flight = max(self.peak_in_flight, len(self.queue))

    def synchronize(self, force: bool = False) -> None:
        if self.queue or force:
            self.host_waits += 1
        self.device_runs(len(self.queue))

    def device_runs(self, n: int = 1) -> None:
        for _ in range(min(n, len(self.queue))):
            self.delivered.append(np.array(self.queue.pop(0)))


def run_steps(launch: Callable, steps: list[np.ndarray], lag: int = 2) -> tuple[list[np.ndarray], CopyStream]:
    """Run ``launch(host, stream, pool, state)`` once per step. Before each call the host writes that step's
    values into ``host`` (the runner's CPU-side state: unpinned, updated in place); ``state`` is a dict the
    launch may keep things in across steps. The device runs each copy ``lag`` steps after the host issued
    it (it is busy with earlier steps). Returns what each copy delivered, in order, and the stream."""
    pool = PinnedPool()
    stream = CopyStream(pool)
    host = np.zeros(len(steps[0]), dtype=np.int64)
    state: dict = {}
    for i, values in enumerate(steps):
        host[:] = values
        launch(host, stream, pool, state)
        if i >= lag:
            stream.device_runs(1)
    stream.device_runs(len(stream.queue))
    return stream.delivered, stream


def drive_launch(launch: Callable, steps: list[list[int]], lag: int) -> dict:
    """Run ``launch`` over ``steps`` (``run_steps``) and write down, as data, what the device received,
    how often the host waited and the most copies in flight at once. It judges nothing (``race_problem``
    does); it runs where ``launch`` lives."""
    delivered, stream = run_steps(launch, [np.asarray(s, dtype=np.int64) for s in steps], lag)
    return dict(delivered=[np.asarray(d).tolist() for d in delivered], host_waits=stream.host_waits,
                peak_in_flight=stream.peak_in_flight)


def race_problem(got: dict, facts: dict) -> str | None:
    """The first thing a run of ``drive_launch`` got wrong, by behaviour: a copy that delivered other
    values than its own step's, a host wait, or more pinned blocks in flight than steps; None when none.
    Any design that behaves passes (a fresh pinned block per copy, a ring deep enough for the lag)."""
    steps, lag = facts["steps"], facts["lag"]
    delivered = got["delivered"]
    if len(delivered) != len(steps):
        return f"{len(delivered)} copies for {len(steps)} steps: issue one copy per step"
    for i, (have, want) in enumerate(zip(delivered, steps, strict=True)):
        if list(have) != list(want):
            later = [j for j, s in enumerate(steps) if list(s) == list(have)]
            what = f"step {later[0]}'s values" if later else f"{list(have)}"
            return (f"step {i}'s copy delivered {what}, not its own {list(want)}: the host overwrote the "
                    "memory while the copy was in flight")
    if got["host_waits"]:
        return (f"the values are right, but the host waited for the device {got['host_waits']} times (a "
                "barrier, or a copy from pageable memory, which cannot run ahead)")
    if got["peak_in_flight"] > lag + 1:
        return f"{got['peak_in_flight']} pinned blocks in flight at once: one per step is enough"
    return None


@dataclass
class RaceTask:
    """Check a ``launch(host, stream, pool, state)`` that stages this step's ``host`` values and issues
    their non-blocking copy, by what the device receives: every step's copy must deliver that step's
    values, the host must never wait for the device, and at most one pinned block per step may be in
    flight. ``reference``, when given, is checked to pass first (the tests hand in the runner's rule; a
    notebook need not show it). For the course's grader: ``cases``, ``driver``, ``reference_facts`` and
    ``same`` as in ``StagedRowsTask``."""

    reference_launch: Callable | None = field(default=None, repr=False)
    seed: int = 0
    lag: int = 2
    name: str = "launch"
    driver: str = "simulators.runner_v2_exercises:drive_launch"
    judge: str = "simulators.runner_v2_exercises:race_problem"  # the student release's check
    hint: str = ("a copy from pinned memory reads its source when the device gets to it, steps later; the "
                 "host must not write that memory again before then, and must not wait for it either: give "
                 "every step's copy pinned memory that no later step writes while the copy is in flight.")

    @property
    def cases(self) -> list[dict]:
        rng = np.random.default_rng(self.seed)
        return [dict(steps=rng.integers(0, 1000, size=(n, 6)).tolist(), lag=self.lag) for n in (5, 8)]

    @staticmethod
    def reference(**case) -> dict:
        return dict(case)

    @staticmethod
    def same(got, facts) -> bool:
        return race_problem(got, facts) is None

    @staticmethod
    def explain(got, facts) -> str:
        return race_problem(got, facts) or "right"

    def check(self, launch: Callable) -> Verdict:
        for c, case in enumerate(self.cases):
            if self.reference_launch is not None and race_problem(drive_launch(self.reference_launch, **case),
                                                                  case):
                raise AssertionError("the reference launch fails its own checker")
            try:
                problem = race_problem(drive_launch(launch, **case), case)
            except NotImplementedError:
                return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
            except Exception as e:
                problem = f"raised {type(e).__name__}: {e}"
            if problem:
                return Verdict(False, f"case {c} ({len(case['steps'])} steps): {problem}")
        return Verdict(True, "every copy delivered its own step's values, the host never waited, and one "
                             "pinned block per step was in flight")


def race_task(reference: Callable | None = None, seed: int = 0) -> HintedTask:
    """The implement-it, its hint shown only after a wrong attempt; ``reference``, when given, is the
    runner's rule (buffers.to_device) in this model's terms, checked to pass first."""
    return HintedTask(RaceTask(reference, seed=seed), name="launch")

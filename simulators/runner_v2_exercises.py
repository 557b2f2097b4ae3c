"""Notebook 07's implement-its: persistent state rows with a staged-write diff, and the pinned-buffer race.

Owns two teaching models and their checkers. Staged rows: a student's row allocator packs the block-table
cells written since the last step and applies them to a device mirror; it is run beside the runner's own
rows (minirunner/worker/states.py, handed in as a factory) on seeded step scripts. The race: a copy engine
that runs a non-blocking host-to-device copy later than the host issues it, reading the source only then,
and pinned host memory handed out per copy as torch's caching host allocator does. Pure numpy; never
imports the runner.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simulators.exercises import Verdict
from simulators.hinted_exercises import HintedTask

__all__ = ["CopyStream", "PinnedPool", "run_steps", "staged_rows_task", "race_task"]


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


@dataclass
class StagedRowsTask:
    """Check ``cls(capacity, width)``: an object with ``sync(request_id, blocks) -> row``,
    ``release(request_id)``, ``pack() -> int64 [2m]`` (m flat cells row * width + column, then their m
    block ids; the cells written since the last pack) and ``apply(mirror, packed)`` (scatter into
    ``mirror``, the device's int32 [capacity * width]). It runs beside ``reference`` (the same interface
    around the runner's rows) and must give the same rows, a mirror equal to the host rows, and send no
    more cells than the reference."""

    reference: Callable = field(repr=False)
    capacity: int = 4
    width: int = 4
    seed: int = 0
    hint: str = ("rows: a free list used as a stack (lowest row first; a freed row is the next handed out), "
                 "a request keeping its row until release; per row remember how many of its block ids were "
                 "written; sync writes only the ids past that count, or the whole row again when the "
                 "written prefix no longer matches (a new table); pack returns the cells written since the "
                 "last pack (row * width + column, then the ids) and forgets them; apply is "
                 "mirror[cells] = ids.")

    def check(self, cls) -> Verdict:
        try:
            verdict = self._run(cls)
        except NotImplementedError:
            return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
        except Exception as e:  # a student's bug is a verdict, not a crash
            verdict = Verdict(False, f"raised {type(e).__name__}: {e}")
        return verdict

    def _run(self, cls) -> Verdict:
        scripts = _scripts(self.seed, self.capacity, self.width)
        for s, script in enumerate(scripts):
            mine, ref = cls(self.capacity, self.width), self.reference(self.capacity, self.width)
            mirror = np.zeros(self.capacity * self.width, dtype=np.int32)
            for n, step in enumerate(script):
                where = f"script {s}, step {n}"
                for rid in step["finished"]:
                    mine.release(rid)
                    ref.release(rid)
                rows = [mine.sync(rid, list(blocks)) for rid, blocks in step["batch"]]
                want = [ref.sync(rid, list(blocks)) for rid, blocks in step["batch"]]
                if [int(r) for r in rows] != want:
                    return Verdict(False, f"{where}: batch {[r for r, _ in step['batch']]} got rows {rows}, "
                                          f"the runner's rows are {want}")
                packed, ref_packed = np.asarray(mine.pack()), np.asarray(ref.pack())
                mine.apply(mirror, packed)
                if len(packed) > len(ref_packed):
                    return Verdict(False, f"{where}: sent {len(packed) // 2} cells, the runner sends "
                                          f"{len(ref_packed) // 2}: send only what changed")
                for (rid, blocks), row in zip(step["batch"], want, strict=True):
                    got = mirror[row * self.width: row * self.width + len(blocks)].tolist()
                    if got != blocks:
                        return Verdict(False, f"{where}: the device mirror's row {row} ({rid}) holds {got}, "
                                              f"its block table is {blocks}")
        return Verdict(True, f"same rows as the runner and a correct mirror over {len(scripts)} seeded "
                             "scripts, never sending more cells than the runner")


def staged_rows_task(reference: Callable, seed: int = 0) -> HintedTask:
    """The implement-it, its hint shown only after a wrong attempt; ``reference(capacity, width)`` builds
    the runner's rows behind the interface."""
    return HintedTask(StagedRowsTask(reference, seed=seed), name="staged rows",
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


@dataclass
class RaceTask:
    """Check a ``launch(host, stream, pool, state)`` that stages this step's ``host`` values and issues
    their non-blocking copy: every step's copy must deliver that step's values, the host must never wait
    for the device, and at most one pinned block per step may be in flight. ``reference``, when given, is
    checked to pass first (the tests hand in the runner's rule; a notebook need not show it)."""

    reference: Callable | None = field(default=None, repr=False)
    seed: int = 0
    lag: int = 2
    hint: str = ("a copy from pinned memory reads its source when the device gets to it, steps later; the "
                 "host must not write that memory again before then, and must not wait for it either: give "
                 "every step's copy its own pinned block (pool.empty or pool.pin_memory), as "
                 "minirunner/worker/buffers.py's pinned() does, and let the allocator recycle it.")

    def cases(self) -> list[list[np.ndarray]]:
        rng = np.random.default_rng(self.seed)
        return [[rng.integers(0, 1000, size=6) for _ in range(n)] for n in (5, 8)]

    def check(self, launch: Callable) -> Verdict:
        for c, steps in enumerate(self.cases()):
            if self.reference is not None and not self._ok(self.reference, steps)[0]:
                raise AssertionError("the reference launch fails its own checker")
            try:
                ok, why = self._ok(launch, steps)
            except NotImplementedError:
                return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
            except Exception as e:
                ok, why = False, f"raised {type(e).__name__}: {e}"
            if not ok:
                return Verdict(False, f"case {c} ({len(steps)} steps): {why}")
        return Verdict(True, "every copy delivered its own step's values, the host never waited, and one "
                             "pinned block per step was in flight")

    def _ok(self, launch: Callable, steps: list[np.ndarray]) -> tuple[bool, str]:
        delivered, stream = run_steps(launch, steps, self.lag)
        if len(delivered) != len(steps):
            return False, f"{len(delivered)} copies for {len(steps)} steps: issue one copy per step"
        for i, (got, want) in enumerate(zip(delivered, steps, strict=True)):
            if not np.array_equal(got, want):
                later = [j for j, s in enumerate(steps) if np.array_equal(got, s)]
                what = f"step {later[0]}'s values" if later else f"{got.tolist()}"
                return False, (f"step {i}'s copy delivered {what}, not its own {want.tolist()}: the host "
                               "overwrote the memory while the copy was in flight")
        if stream.host_waits:
            return False, (f"the values are right, but the host waited for the device {stream.host_waits} "
                           "times (a barrier, or a copy from pageable memory, which cannot run ahead)")
        if stream.peak_in_flight > self.lag + 1:
            return False, f"{stream.peak_in_flight} pinned blocks in flight at once: one per step is enough"
        return True, ""


def race_task(reference: Callable | None = None, seed: int = 0) -> HintedTask:
    """The implement-it, its hint shown only after a wrong attempt; ``reference``, when given, is the
    runner's rule (buffers.to_device) in this model's terms, checked to pass first."""
    return HintedTask(RaceTask(reference, seed=seed), name="launch")

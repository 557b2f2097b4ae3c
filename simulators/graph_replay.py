"""Capture and replay of a toy decode step over static buffers with padding rows: notebook 05's
implement-it, checked step by step against the runner's own buffer writes.

Owns the toy world (static numpy buffers allocated once, a KV pool of slots, one "captured" step per
bucket that holds views of the buffers' first rows and, on replay, writes each row's token into its slot
and attends over its block table up to its seq_len) and the checker. Pure numpy: the runner's rows
(``minirunner.worker.buffers.StepBuffers``) come in as a function the notebook passes.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simulators.exercises import Verdict

BUFFERS = ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables")
__all__ = ["BUFFERS", "ToyGraph", "ToyWorld", "ReplayTask", "make_replay_task", "observe", "compare"]
LADDER = (2, 4, 8)


class ToyGraph:
    """A step "captured" for ``bucket`` rows: it keeps views of the first ``bucket`` rows of each buffer
    (their storage, as a CUDA graph keeps addresses) and an output array of its own. ``replay()`` reads
    only those views: row r writes token_r * 1000 + position_r into kv[slot_r] (none when slot_r is -1),
    then sums kv over its first seq_r positions through its block-table row."""

    def __init__(self, world: ToyWorld, bucket: int):
        self.bucket, self.world = bucket, world
        self.views = {name: world.buffers[name][:bucket] for name in BUFFERS}
        self.out = np.zeros(bucket, dtype=np.int64)
        self.replays = 0

    def replay(self) -> np.ndarray:
        v, kv, bs = self.views, self.world.kv, self.world.block_size
        for r in range(self.bucket):
            slot = int(v["slot_mapping"][r])
            if slot >= 0:
                kv[slot] = int(v["input_ids"][r]) * 1000 + int(v["positions"][r])
        for r in range(self.bucket):
            n = int(v["seq_lens"][r])
            blocks = v["block_tables"][r]
            self.out[r] = sum(int(kv[int(blocks[j // bs]) * bs + j % bs]) for j in range(n))
        self.replays += 1
        return self.out


@dataclass
class ToyWorld:
    """Static buffers for ``max_seqs`` rows (block tables ``width`` columns), a KV pool of
    ``num_blocks`` blocks of ``block_size`` slots (every slot starts at -7: a read of a slot nobody
    wrote shows), and one ToyGraph per rung of ``ladder``."""

    ladder: tuple[int, ...]
    width: int = 4
    block_size: int = 4
    num_blocks: int = 40
    buffers: dict = field(init=False)
    kv: np.ndarray = field(init=False)
    graphs: dict = field(init=False)

    def __post_init__(self):
        s = max(self.ladder)
        self.buffers = {"input_ids": np.zeros(s, np.int64), "positions": np.zeros(s, np.int64),
                        "slot_mapping": np.full(s, -1, np.int64), "seq_lens": np.zeros(s, np.int32),
                        "block_tables": np.zeros((s, self.width), np.int32)}
        self.kv = np.full(self.num_blocks * self.block_size, -7, np.int64)
        self.graphs = {b: ToyGraph(self, b) for b in self.ladder}


def _steps(rng: random.Random, ladder, width, block_size, num_blocks, num_steps):
    """Seeded decode steps of one batch: requests own disjoint blocks, positions grow by one per step,
    requests leave (so later batches are smaller and land on padded buckets)."""
    n0 = rng.randint(max(ladder) - 3, max(ladder))
    free = list(range(1, num_blocks))  # block 0 stays for padding rows' table
    rng.shuffle(free)
    reqs = []
    for i in range(n0):
        length = rng.randint(1, width * block_size - num_steps - 1)
        nblk = -(-(length + num_steps) // block_size)
        blocks = [free.pop() for _ in range(nblk)]
        reqs.append({"token": rng.randint(3, 99), "pos": length - 1, "blocks": blocks, "id": i})
    steps = []
    alive = list(reqs)
    for s in range(num_steps):
        if s:
            for _ in range(rng.randint(0, max(0, len(alive) - 1))):
                if len(alive) > 1:
                    alive.pop(rng.randrange(len(alive)))
        for r in alive:
            r["pos"] += 1
            r["token"] = (r["token"] * 7 + 3) % 97 + 3
        steps.append({"ids": [r["token"] for r in alive], "positions": [r["pos"] for r in alive],
                      "tables": [list(r["blocks"]) for r in alive]})
    return steps


@dataclass
class ReplayTask:
    """Implement it: ``replay_step(graphs, buffers, ids, positions, tables, block_size)`` writes this
    step's rows into the static buffers, replays the right graph and returns the real rows' outputs.
    ``check(fn)`` runs seeded sequences of steps in two toy worlds, one filled by ``fn`` and one by the
    runner's rows (``runner_rows(ids, positions, tables, bucket, block_size, width) -> {buffer: rows}``),
    and after each step compares what ``compare`` grades: the graph replayed, the captured storage kept,
    the KV pool and the real rows' outputs (the property, not the runner's convention for rows nobody
    reads)."""

    runner_rows: Callable = field(repr=False)
    cases: list = field(repr=False)
    ladder: tuple[int, ...] = LADDER
    name: str = "replay_step"
    # how a grader runs a student's function on one case without the reference (course_grading)
    driver: str = "simulators.graph_replay:observe"
    hint: str = ("every row of the bucket is written before each replay, padding rows too (what does a "
                 "row that writes nothing and reads nothing hold?); write into the arrays in place — a "
                 "graph keeps the storage it was captured with, so a new array is never seen.")

    def check(self, fn: Callable) -> Verdict:
        for c, steps in enumerate(self.cases):
            try:
                got = observe(fn, steps, self.ladder)
            except NotImplementedError:
                return Verdict(False, f"{self.name}: {self.hint}", answered=False,
                               pending="not implemented yet")
            except Exception as e:  # a student's bug is a verdict, not a crash of the notebook
                return Verdict(False, f"case {c} raised {type(e).__name__}: {e}")
            wrong = compare(got, self.expected(steps))
            if wrong:
                return Verdict(False, f"case {c}, {wrong} (ladder {list(self.ladder)})")
        total = sum(len(s) for s in self.cases)
        return Verdict(True, f"{self.name} agrees with the runner on all {total} steps of "
                             f"{len(self.cases)} runs")

    def expected(self, steps: list) -> list[dict]:
        """What ``observe`` records for the runner's own writes on one case (in the grader only)."""
        def runner_step(graphs, buffers, ids, positions, tables, block_size):
            bucket = self.ladder[bisect.bisect_left(self.ladder, len(ids))]
            width = buffers["block_tables"].shape[1]
            rows = self.runner_rows(ids, positions, tables, bucket, block_size, width)
            for name in BUFFERS:
                buffers[name][:bucket] = rows[name][:bucket]
            return graphs[bucket].replay()[:len(ids)].copy()

        return observe(runner_step, steps, self.ladder)

    def same(self, got, want) -> bool:
        return compare(got, want) is None


def observe(fn: Callable, steps: list, ladder=LADDER) -> list[dict]:
    """Run ``fn`` (a ``replay_step``) over one case's decode steps in a fresh toy world and record, per
    step, the graphs it replayed, whether each buffer is still the captured storage, every buffer, the
    KV pool and what it returned: plain lists, so a record can leave a student's kernel as text.
    Holds no reference; ``compare`` says where two records differ."""
    world = ToyWorld(tuple(ladder))
    storage = {name: world.buffers[name] for name in BUFFERS}
    records = []
    for step in steps:
        before = {b: g.replays for b, g in world.graphs.items()}
        args = {k: [list(t) for t in v] if k == "tables" else list(v) for k, v in step.items()}
        got = fn(graphs=world.graphs, buffers=world.buffers, block_size=world.block_size, **args)
        records.append({
            "batch": len(step["ids"]),
            "replayed": [b for b, g in world.graphs.items() if g.replays != before[b]],
            "new_arrays": [n for n in BUFFERS if world.buffers[n] is not storage[n]],
            "buffers": {n: storage[n].tolist() for n in BUFFERS},
            "kv": world.kv.tolist(), "out": np.asarray(got).tolist()})
    return records


def compare(got: list[dict], want: list[dict]) -> str | None:
    """Where a student's records (``observe``) first differ from the runner's, or None. It grades the
    property, not the runner's convention: the graph replayed, the captured storage kept, no padding
    row writing a KV slot (in a real pool that slot may be a live request's), the KV pool and the real
    rows' outputs must agree; buffer rows may hold anything that changes none of these (a padding
    row's token id, a table's columns past the row's blocks). When the pool or the outputs
    differ, the first buffer whose rows differ from the runner's is named as the likely cause."""
    for s, (g, w) in enumerate(zip(got, want, strict=False)):
        where = f"step {s} (batch {w['batch']})"
        bucket = w["replayed"][0]
        if g["replayed"] != w["replayed"]:
            return (f"{where}: replayed the graph(s) for {g['replayed']} rows, expected one replay of "
                    f"the {bucket}-row graph")
        if g["new_arrays"]:
            return (f"{where}: buffers[{g['new_arrays'][0]!r}] is a new array; the captured graph still "
                    "reads the old one")
        padding = g["buffers"]["slot_mapping"][w["batch"]:bucket]
        writing = {r: slot for r, slot in enumerate(padding, w["batch"]) if slot >= 0}
        if writing:
            return (f"{where}: padding rows {sorted(writing)} have slot_mapping {list(writing.values())}; a "
                    "padding row must write no KV: the slot may belong to a live request")
        if g["kv"] != w["kv"]:
            diff = [i for i, (a, b) in enumerate(zip(g["kv"], w["kv"], strict=True)) if a != b]
            return f"{where}: the KV pool differs at slots {diff[:8]}{_cause(g, w, bucket)}"
        if g["out"] != w["out"]:
            return (f"{where}: returned {g['out']}, expected the real rows' outputs {w['out']}"
                    f"{_cause(g, w, bucket)}")
    if len(got) != len(want):
        return f"recorded {len(got)} steps, expected {len(want)}"
    return None


def _cause(g: dict, w: dict, bucket: int) -> str:
    for n in BUFFERS:
        if g["buffers"][n][:bucket] != w["buffers"][n][:bucket]:
            return (f" ({n} rows 0..{bucket - 1} are {g['buffers'][n][:bucket]}, the runner writes "
                    f"{w['buffers'][n][:bucket]})")
    return ""


def make_replay_task(runner_rows: Callable, seed: int = 0, num_cases: int = 6,
                     num_steps: int = 4) -> ReplayTask:
    """The implement-it of notebook 05 over seeded runs of ``num_steps`` decode steps each (batches
    shrink as requests leave, so padded buckets follow larger ones and a stale row shows)."""
    rng = random.Random(seed)
    task = ReplayTask(runner_rows, [])
    for _ in range(num_cases):
        task.cases.append(_steps(rng, task.ladder, 4, 4, 40, num_steps))
    return task

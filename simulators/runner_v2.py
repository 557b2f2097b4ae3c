"""Model Runner V2 for notebook 07: persistent state rows and idx_mapping, the most a faster runner can buy,
and the exercises and implement-it task that go with them.

Owns pure teaching helpers: a row-assignment model of a persistent batch (a free list, rows kept for a
request's life), the bound on a runner's gain from host and device time per step, and seeded exercises
with checkers. It imports nothing of the runner: a reference function is passed in as data.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np

from simulators.exercises import Exercise, ImplementIt, Verdict, parse_int

MEANINGS = ("kernel", "abstraction", "memory model")


class PersistentRows:
    """Row assignment of a persistent batch: a request takes a free row when admitted and keeps it until
    it finishes; a finished request's row is the next one handed out (the free list is a stack, lowest
    row first at the start), as in ``minirunner/worker/states.py``. ``idx_mapping(batch)`` is the row of
    each request in this step's batch order."""

    def __init__(self, capacity: int):
        self.row_of: dict[str, int] = {}
        self.free = list(range(capacity - 1, -1, -1))

    def admit(self, request_id: str) -> int:
        if request_id not in self.row_of:
            if not self.free:
                raise ValueError("no free row")
            self.row_of[request_id] = self.free.pop()
        return self.row_of[request_id]

    def finish(self, request_id: str) -> None:
        self.free.append(self.row_of.pop(request_id))

    def idx_mapping(self, batch: Sequence[str]) -> list[int]:
        return [self.admit(r) for r in batch]


def compaction_moves(before: Sequence[str], finished: str) -> int:
    """Rows a V1-style compacting batch moves when ``finished`` leaves: every request after it shifts up
    by one (vLLM V1's condense moves the last rows into the holes; either way rows move)."""
    return len(before) - 1 - list(before).index(finished)


def runner_gain(host_us: float, device_us: float, overlapped: bool = False) -> float:
    """The most a runner whose host work per step fell to zero could speed a step up, as a fraction.

    Synchronous: a step takes host + device, so removing the host buys host / device. Overlapped
    (async scheduling): a step takes max(host, device), so the host costs only what exceeds the device."""
    if host_us < 0 or device_us <= 0:
        raise ValueError("host_us >= 0 and device_us > 0")
    step = max(host_us, device_us) if overlapped else host_us + device_us
    return step / device_us - 1.0


def host_share(host_us: float, device_us: float) -> float:
    """The share of a synchronous step that is the runner's host work."""
    return host_us / (host_us + device_us)


def _number(answer) -> float | None:
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        return float(answer)
    if isinstance(answer, str):
        try:
            return float(answer.strip().rstrip("%")) / (100 if answer.strip().endswith("%") else 1)
        except ValueError:
            return None
    return None


def make_gain_exercise(seed: int) -> Exercise:
    """Compute: host and device µs per step of a synchronous runner; the most a zero-cost runner buys."""
    rng = random.Random(seed)
    host = rng.choice([50, 80, 120, 150, 200])
    device = rng.choice([250, 400, 800, 1600, 3300])
    answer = runner_gain(host, device)
    question = (f"A synchronous decode step spends {host} µs of host work (scheduling, input preparation, "
                f"reading tokens back) and then {device} µs on the device. A new runner takes the host work "
                "to zero. By what fraction can steps per second rise at most? (e.g. 0.25 for +25%)")

    def diagnose(a) -> Verdict:
        x = _number(a)
        if x is None:
            return Verdict(False, "give a number, a fraction such as 0.25 (or '25%').")
        share = host_share(host, device)
        if abs(x - answer) <= 0.01 * answer + 1e-3 and abs(x - answer) < abs(x - share):
            return Verdict(True, f"(host + device) / device − 1 = {host + device}/{device} − 1 "
                                 f"= {answer:.3f}.")
        if abs(x - share) <= abs(x - answer):
            return Verdict(False, "that is the host's share of the step; the gain compares the new step "
                                  "time with the old one.")
        if abs(x - (answer + 1)) < 1e-3:
            return Verdict(False, "that is the speed-up factor; subtract 1 for the fraction gained.")
        return Verdict(False, "the old step is host + device, the new one device alone.")

    return Exercise(seed, question, answer, diagnose)


def make_idx_mapping_exercise(seed: int, capacity: int = 6) -> Exercise:
    """Predict: rows assigned, one request finishes, one is admitted; the next step's idx_mapping."""
    rng = random.Random(seed)
    names = ["A", "B", "C", "D", "E"]
    n = rng.randint(3, 4)
    first = names[:n]
    rows = PersistentRows(capacity)
    before = rows.idx_mapping(first)
    gone = rng.choice(first[:-1])
    rows.finish(gone)
    new = names[n]
    batch = [r for r in first if r != gone]
    rng.shuffle(batch)
    pos = rng.randint(0, len(batch))
    batch.insert(pos, new)
    answer = rows.idx_mapping(batch)
    question = (f"A persistent batch of {capacity} state rows (free rows handed out lowest first; a freed "
                f"row is the next one handed out). Step 1 runs {first} with idx_mapping {before}. "
                f"Then {gone} finishes and {new} is admitted. Step 2's batch, in order, is {batch}. "
                "What is step 2's idx_mapping (a list of rows)?")
    compact = list(range(len(batch)))

    def diagnose(a) -> Verdict:
        try:
            got = [parse_int(x) for x in a]
        except TypeError:
            return Verdict(False, "give a list of ints, one row per request of step 2's batch.")
        if any(x is None for x in got) or len(got) != len(batch):
            return Verdict(False, f"give {len(batch)} ints, one row per request, in batch order.")
        if got == answer:
            return Verdict(True, f"rows stay put; {new} takes the row {gone} freed: {answer}.")
        if got == compact:
            return Verdict(False, "that is a compacted batch (V1's rows 0..n-1): here rows do not move, "
                                  "the step gathers them.")
        return Verdict(False, f"each surviving request keeps its step-1 row; {new} takes a free row "
                              f"(which one was freed last?).")

    return Exercise(seed, question, answer, diagnose)


def make_meaning_exercise(seed: int) -> Exercise:
    """Explain: which of the three meanings of "PagedAttention" a sentence uses, and so whether v0.25
    deleted it."""
    statements = [
        ("csrc/attention/attention_kernels.cu, the 2023 CUDA code that read a block table", "kernel"),
        ("attention reads K and V through a logical-to-physical block indirection", "abstraction"),
        ("KV is kept in fixed-size blocks allocated on demand from a pool", "memory model"),
        ("FlashInfer's decode wrapper reading kv_indices page by page", "abstraction"),
        ("a block table row per request, grown one block id at a time", "memory model"),
        ("the one CUDA file the docs PR #54737 says is gone", "kernel"),
    ]
    rng = random.Random(seed)
    text, answer = rng.choice(statements)
    question = (f'"PagedAttention" in this sentence: "{text}". Which meaning is it: "kernel", "abstraction" '
                'or "memory model"? (v0.25 deleted exactly one of the three.)')

    def diagnose(a) -> Verdict:
        x = str(a).strip().lower()
        if x not in MEANINGS:
            return Verdict(False, 'answer "kernel", "abstraction" or "memory model".')
        if x == answer:
            kept = "deleted in v0.25" if answer == "kernel" else "kept in v0.25"
            return Verdict(True, f"the {answer}: {kept}.")
        return Verdict(False, "a kernel is code that runs; an abstraction is how attention finds its KV; a "
                              "memory model is how KV memory is laid out and handed out.")

    return Exercise(seed, question, answer, diagnose)


def make_slot_mapping_task(reference: Callable, seed: int = 0, num_cases: int = 8) -> ImplementIt:
    """Implement-it: the idx_mapping gather behind the slot mapping. ``reference(block_tables, idx_mapping,
    num_computed, query_lens, block_size)`` returns the slot of every scheduled token (a list of ints);
    the notebook passes the runner's twin (minirunner.kernels.input_prep.prepare_inputs_ref)
    wrapped to that shape."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(num_cases):
        block_size = int(rng.choice([1, 2, 4, 16]))
        capacity, width = 6, 4
        n = int(rng.integers(1, capacity + 1))
        rows = rng.permutation(capacity)[:n].tolist()
        tables = rng.permutation(40)[:capacity * width].reshape(capacity, width).tolist()
        computed = rng.integers(0, width * block_size // 2 + 1, capacity).tolist()
        qlens = [int(rng.integers(1, width * block_size - computed[r] + 1)) if i % 2 else 1 for r in rows]
        cases.append(dict(block_tables=tables, idx_mapping=rows, num_computed=computed, query_lens=qlens,
                          block_size=block_size))
    return ImplementIt("slot mapping", reference, cases,
                       same=lambda a, b: [int(x) for x in a] == [int(x) for x in b],
                       hint="for each request b, row = idx_mapping[b]; for each of its query_lens[b] tokens, "
                            "pos = num_computed[row] + j, slot = block_tables[row][pos // block_size] * "
                            "block_size + pos % block_size.")

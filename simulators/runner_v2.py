"""Model Runner V2 for notebook 07: persistent state rows and idx_mapping, vLLM V1's batch for contrast, the
most a faster runner can buy, and the exercises that go with them.

Owns pure teaching helpers: a row-assignment model of a persistent batch (a free list, rows kept for a
request's life), models of V1's condense and reorder rules, the bound on a runner's gain from host and
device time per step, and seeded exercises with checkers. It imports nothing of the runner.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from simulators.exercises import Exercise, Verdict, parse_int

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


def v1_admit_and_condense(before: Sequence[str], finished: Sequence[str], admitted: Sequence[str]
                          ) -> tuple[list[str], list[tuple[int, int]]]:
    """vLLM V1's persistent batch across one step (``GPUModelRunner._update_states`` in
    vllm/v1/worker/gpu_model_runner.py, ``InputBatch.condense`` in vllm/v1/worker/gpu_input_batch.py).

    The ``finished`` requests leave holes; the ``admitted`` ones fill the smallest holes first, then go
    at the end; ``condense`` then moves the last live row into each hole that is left, smallest hole
    first. Returns the rows after, in order, and the moves (from row, to row): one per hole left
    between live rows, none when an admission fills it."""
    rows: list[str | None] = list(before)
    holes = sorted(rows.index(r) for r in finished)
    for r in finished:
        rows[rows.index(r)] = None
    for r in admitted:
        if holes:
            rows[holes.pop(0)] = r
        else:
            rows.append(r)
    moves = []
    last = len(rows) - 1
    for hole in holes:
        while last >= 0 and rows[last] is None:
            last -= 1
        if hole >= last:
            break
        rows[hole], rows[last] = rows[last], None
        moves.append((last, hole))
        last -= 1
    return [r for r in rows if r is not None], moves


def v1_reorder_swaps(is_decode: Sequence[bool]) -> list[tuple[int, int]]:
    """The row swaps vLLM V1 makes so that decode requests come first for the attention backend
    (``reorder_batch_to_split_decodes_and_prefills`` in vllm/v1/attention/backends/utils.py): the i-th
    prefill from the front swaps with the i-th decode from the back, until every decode is in front.
    Each swap exchanges two whole rows of the input batch (``InputBatch.swap_states``)."""
    decodes = [i for i, d in enumerate(is_decode) if d]
    prefills = [i for i, d in enumerate(is_decode) if not d]
    swaps = []
    for i in range(1, min(len(decodes), len(prefills)) + 1):
        decode = decodes[len(decodes) - i]
        if decode < len(decodes):
            break
        swaps.append((prefills[i - 1], decode))
    return swaps


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
            return Verdict(False, "give a number, a fraction such as 0.25 (or '25%').", attempt=False)
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
            got = [parse_int(x) for x in a] if not isinstance(a, (str, dict)) else None
        except TypeError:
            got = None
        if got is None or any(x is None for x in got) or len(got) != len(batch):
            return Verdict(False, f"give a list of {len(batch)} ints, one row per request of step 2's "
                                  "batch, in batch order.", attempt=False)
        if got == answer:
            return Verdict(True, f"rows stay put; {new} takes the row {gone} freed: {answer}.")
        if got == compact:
            return Verdict(False, "that numbers the batch 0..n-1 as if rows followed batch order: here a "
                                  "request's row is where it was admitted, and the step gathers them.")
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
            return Verdict(False, 'answer "kernel", "abstraction" or "memory model".', attempt=False)
        if x == answer:
            kept = "deleted in v0.25" if answer == "kernel" else "kept in v0.25"
            return Verdict(True, f"the {answer}: {kept}.")
        return Verdict(False, "a kernel is code that runs; an abstraction is how attention finds its KV; a "
                              "memory model is how KV memory is laid out and handed out.")

    return Exercise(seed, question, answer, diagnose)

"""Seeded exercises on capturing a decode step: what breaks a capture, what a padding row must hold,
which bucket ladder suits a batch-size distribution, and the bucket picker to implement.

Owns the questions and their checkers for notebook 05. Pure Python: the ladder arithmetic comes from
``simulators.buckets``; the runner's own bucket picker is passed in as the reference of the
implement-it task (a simulator never imports the runner).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from simulators.buckets import check_ladder, padded_batch_size
from simulators.exercises import Exercise, ImplementIt, Verdict, parse_choice

__all__ = ["CAPTURE_SNIPPETS", "make_capture_exercise", "make_padding_row_exercise",
           "expected_padding_rows", "make_ladder_exercise", "make_bucket_task"]

_LETTERS = "abcdefgh"

# (code inside the captured step, breaks capture?, why): PyTorch's CUDA-graph notes list the host syncs,
# dynamic shapes and control flow, and CPU work that a replay skips.
CAPTURE_SNIPPETS: tuple[tuple[str, bool, str], ...] = (
    ("n = int(seq_lens.max())  # longest sequence in the batch", True,
     "int(tensor) is a host sync: the host waits for a value the device has not produced yet"),
    ("if (logits > 30).any(): logits = logits.clamp(max=30)  # soft cap", True,
     "a branch on a tensor's value is a host sync, and the branch taken is frozen into the recording"),
    ("kv = gather(cache, block_tables[:, :max_blocks_now])  # max_blocks_now: this step's widest row", True,
     "the slice's width follows the data: a graph records one shape, so the next step reads the wrong "
     "columns"),
    ("print(hidden.norm())  # debug output", True, "printing a device tensor copies it to the host: a sync"),
    ("hidden = hidden + residual  # residual connection", False,
     "device arithmetic on fixed shapes and fixed addresses: exactly what a graph records"),
    ("slots = slot_mapping  # slot_mapping: a buffer allocated at start-up", False,
     "reading a static buffer is the point: the runner copies this step's values into it first"),
    ("logits = lm_head(hidden[:bucket])  # bucket: set when the graph was captured", False,
     "a slice fixed at capture time is a fixed shape"),
    ("next_ids = logits.argmax(-1)  # greedy pick", False,
     "a device op writing a device buffer: nothing for the host to wait on"),
    ("scratch = torch.empty_like(hidden)  # a temporary for this step", False,
     "an allocation during capture comes from the graph's private pool, and every replay reuses the same "
     "address: allocating is fine, reallocating *between* replays is what breaks"),
)


def _letters(answer) -> set[str] | None:
    if not isinstance(answer, str | list | tuple | set):
        return None
    text = "".join(answer) if not isinstance(answer, str) else answer
    picked = {c for c in text.lower() if c.isalpha()}
    return picked


def make_capture_exercise(seed: int) -> Exercise:
    """Explain: which of five lines inside a captured decode step break the capture? Answer the letters."""
    rng = random.Random(seed)
    breaking = [s for s in CAPTURE_SNIPPETS if s[1]]
    fine = [s for s in CAPTURE_SNIPPETS if not s[1]]
    k = rng.randint(1, 3)
    chosen = rng.sample(breaking, k) + rng.sample(fine, 5 - k)
    rng.shuffle(chosen)
    options = dict(zip(_LETTERS, chosen, strict=False))
    solution = "".join(sorted(letter for letter, s in options.items() if s[1]))
    lines = "\n".join(f"  ({letter}) {s[0]}" for letter, s in options.items())
    question = ("Each line below sits inside a decode step you want to capture as one CUDA graph. Which "
                f"ones break the capture or make its replay wrong? Answer the letters, e.g. \"ac\".\n{lines}")

    def diagnose(answer) -> Verdict:
        picked = _letters(answer)
        if picked is None or not picked or not picked <= set(options):
            return Verdict(False, f"answer with letters from {''.join(options)}", attempt=False)
        want = set(solution)
        if picked == want:
            return Verdict(True, "; ".join(f"({c}) {options[c][2]}" for c in sorted(want)))
        missed, extra = sorted(want - picked), sorted(picked - want)
        why = [f"({c}) does break it — think about what the host would need" for c in missed]
        why += [f"({c}) is capturable: {options[c][2]}" for c in extra]
        return Verdict(False, "; ".join(why))

    return Exercise(seed, question, solution, diagnose,
                    hint="a graph repeats device work on fixed shapes at fixed addresses; anything that "
                         "needs a device value on the host, or a shape that follows the data, breaks it.")


# Candidate padding rows: (description, safe?, why). Block id 0 is a valid block of the pool; a row with
# seq_len 0 reads none of it.
_PADDING_ROWS: tuple[tuple[str, bool, str], ...] = (
    ("slot -1, seq_len 0, block-table row {zeros}, token id 0", True,
     "slot -1 writes nowhere, seq_len 0 attends to nothing, and every id it holds is valid"),
    ("slot {slot}, seq_len 0, block-table row {zeros}, token id 0", False,
     "slot {slot} belongs to a real request: the padding row's K and V overwrite that token's cache"),
    ("slot {slot}, seq_len {seqlen}, block-table row {stale}, token id {token}", False,
     "these are the values the previous step left in the row (another request's slot, length and "
     "table): a stale row writes into that request's cache slot and attends over its blocks — "
     "nano-vllm's issue #190 is this bug"),
    ("slot -1, seq_len 0, block-table row {zeros}, token id -1", False,
     "token id -1 is not in the vocabulary: the embedding lookup of the padding row indexes out of "
     "bounds, although nothing it computes is kept"),
    ("slot -1, seq_len 0, block-table row {bad_row}, token id 0", False,
     "block id {bad} is outside the KV pool: a kernel that reads the table indexes out of bounds"),
)


def make_padding_row_exercise(seed: int) -> Exercise:
    """Compute: which of four candidate padding rows is safe to replay? Answer a letter."""
    rng = random.Random(seed)
    blocks, block_size = rng.choice((16, 32, 64)), 16
    slot = rng.randrange(block_size, blocks * block_size)
    seqlen, bad = rng.randint(3, 40), blocks + rng.randint(1, 9)
    batch = rng.randint(1, 7)
    bucket = padded_batch_size(batch, [1, 2, 4, 8])
    if bucket == batch:
        batch, bucket = 3, 4
    unsafe = rng.sample(_PADDING_ROWS[1:], 3)
    rows = [_PADDING_ROWS[0], *unsafe]
    rng.shuffle(rows)
    stale_blocks = rng.sample(range(1, blocks), 4)
    stale_blocks[(seqlen - 1) // block_size + 1:] = [0] * (4 - (seqlen - 1) // block_size - 1)
    slot = stale_blocks[(seqlen - 1) // block_size] * block_size + (seqlen - 1) % block_size
    fill = {"slot": slot, "seqlen": seqlen, "bad": bad, "zeros": [0, 0, 0, 0], "bad_row": [bad] * 4,
            "stale": stale_blocks, "token": rng.randint(3, 500)}
    options = {c: (d.format(**fill), ok, why.format(**fill)) for c, (d, ok, why) in zip(_LETTERS, rows,
                                                                                          strict=False)}
    solution = next(c for c, o in options.items() if o[1])
    lines = "\n".join(f"  ({c}) {o[0]}" for c, o in options.items())
    rows_text = f"row {batch} is" if bucket - batch == 1 else f"rows {batch}..{bucket - 1} are"
    question = (f"A decode batch of {batch} requests replays the graph captured for {bucket} rows, so "
                f"{rows_text} padding. The KV pool has {blocks} blocks (ids 0..{blocks - 1}) of "
                f"{block_size} slots. Which padding row is safe? Answer a letter.\n{lines}")

    def diagnose(answer) -> Verdict:
        choice = parse_choice(answer, options)
        if choice is None:
            return Verdict(False, f"answer one letter of {''.join(options)}", attempt=False)
        ok, why = options[choice][1], options[choice][2]
        return Verdict(ok, why)

    return Exercise(seed, question, solution, diagnose,
                    hint="a padding row must write no real slot, attend to nothing, and hold only valid "
                         "indices; the runner writes every padding row before each replay.")


def expected_padding_rows(distribution: dict[int, float], ladder: Sequence[int]) -> float:
    """Expected padding rows per step when batch size b occurs with probability distribution[b] and each
    batch runs at its bucket on ``ladder`` (a batch above the largest rung runs eager: no padding)."""
    sizes = check_ladder(ladder)
    total = sum(distribution.values())
    if total <= 0 or any(p < 0 for p in distribution.values()):
        raise ValueError("the distribution's weights must be non-negative and not all zero")
    pad = 0.0
    for b, p in distribution.items():
        bucket = padded_batch_size(b, sizes)
        pad += p * (0 if bucket is None else bucket - b)
    return pad / total


def make_ladder_exercise(seed: int) -> Exercise:
    """Predict: of three four-rung ladders, which wastes the fewest padding rows per step on a given
    batch-size distribution? Answer a letter."""
    rng = random.Random(seed)
    while True:
        sizes = sorted(rng.sample(range(1, 33), 5))
        weights = [rng.randint(1, 9) for _ in sizes]
        dist = dict(zip(sizes, [w / sum(weights) for w in weights], strict=True))
        top = max(sizes)
        frequent = sorted(sizes, key=lambda b: -dist[b])[:3]
        candidates = [[s for s in (1, 2, 4, 8, 16) if s < top] + [top],  # doubling, then the top
                      sorted({*sizes[:3], top}),                          # the three smallest sizes seen
                      sorted({*frequent, top})]                           # the three most frequent
        rng.shuffle(candidates)
        ladders = dict(zip("abc", candidates, strict=True))
        cost = {k: expected_padding_rows(dist, v) for k, v in ladders.items()}
        ranked = sorted(cost.values())
        if len(set(map(tuple, ladders.values()))) == 3 and ranked[1] - ranked[0] > 0.25:
            break
    best = min(cost, key=cost.get)
    shown = ", ".join(f"{b} ({100 * p:.0f}%)" for b, p in dist.items())
    lines = "\n".join(f"  ({k}) {v}" for k, v in ladders.items())
    question = (f"Decode batches have these sizes (share of steps): {shown}. Every ladder must reach "
                f"{top}. Which ladder wastes the fewest padding rows per step on average? Answer a letter."
                f"\n{lines}")

    def diagnose(answer) -> Verdict:
        choice = parse_choice(answer, ladders)
        if choice is None:
            return Verdict(False, 'answer "a", "b" or "c"', attempt=False)
        detail = ", ".join(f"{k}: {cost[k]:.2f} rows" for k in sorted(cost))
        if choice == best:
            return Verdict(True, f"expected padding rows per step: {detail}. Rungs at the sizes that "
                                 "occur waste nothing on them.")
        return Verdict(False, f"({choice}) wastes {cost[choice]:.2f} rows per step; weigh each batch size "
                              "by how often it occurs and pad it to its rung.")

    return Exercise(seed, question, best, diagnose,
                    hint="for each ladder, sum share × (bucket − batch) over the batch sizes.")


def make_bucket_task(reference: Callable[[int, Sequence[int]], int | None], seed: int = 0,
                     num_cases: int = 40) -> ImplementIt:
    """Implement it: ``bucket_for(batch_size, sizes)``, the smallest captured size that holds the batch
    (``sizes`` sorted), or None when none does and the step runs eager. ``reference`` is the runner's own
    (``minirunner.worker.cudagraph.bucket_for``), passed in."""
    rng = random.Random(seed)
    cases: list[dict] = [{"batch_size": 17, "sizes": [1, 2, 4, 8, 16, 24, 32]},
                         {"batch_size": 8, "sizes": [1, 2, 4, 8, 16]},
                         {"batch_size": 1, "sizes": [1, 2, 4, 8]},
                         {"batch_size": 40, "sizes": [1, 2, 4, 8, 16, 24, 32]},
                         {"batch_size": 3, "sizes": [4]}]
    while len(cases) < num_cases:
        sizes = sorted(rng.sample(range(1, 65), rng.randint(1, 8)))
        cases.append({"batch_size": rng.randint(1, 72), "sizes": sizes})
    return ImplementIt("bucket_for", reference, cases,
                       hint="walk the sorted sizes and return the first one >= batch_size; return None "
                            "when the batch is larger than every captured size.")

"""Block tables step by step: a small twin of the runner's block bookkeeping, and notebook 03's
exercises built on it (predict a block table, name the preempted request, count cached tokens) and
its implement-it task (the slot mapping).

Owns ``simulate_block_tables``, a pure-Python model of what ``minirunner``'s scheduler and block
pool do with block ids (free list order, oldest-first growth, newest-first preemption), and the
seeded exercises. It never runs a model; the tests check it against the real engine's step trace.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from simulators.exercises import Exercise, ImplementIt, Verdict, parse_int


def _blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass(frozen=True)
class BlockStep:
    """One engine step as the twin sees it: tables during the step (after scheduling, before
    finished requests free their blocks), who was preempted, who finished."""

    step: int
    scheduled: tuple[int, ...]
    block_tables: dict  # request index -> list of physical block ids
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    blocks_free: int


def simulate_block_tables(prompt_lens: list[int], max_tokens: list[int], block_size: int,
                          num_blocks: int, max_num_seqs: int = 8) -> list[BlockStep]:
    """Every request arrives at step 0. Per step: running requests, oldest first, get the blocks
    for their tokens so far; when the pool is dry the newest running request is preempted (blocks
    freed, back to the head of the queue); then, if nobody was preempted, waiting requests are
    admitted first come first served while their tokens fit with one block of headroom left per
    running request (admitting into the last free blocks would only force a preemption soon).
    Each scheduled request then gains a token; one that has max_tokens finishes and frees its
    blocks (last block first) to the back of the free list. Prompts are assumed to fit one step's
    token budget (no chunked prefill)."""
    if len(prompt_lens) != len(max_tokens):
        raise ValueError("give one max_tokens per prompt")
    if any(p < 1 for p in prompt_lens) or any(m < 1 for m in max_tokens):
        raise ValueError("prompt lengths and max_tokens must be >= 1")
    if max(_blocks(p + m, block_size) for p, m in zip(prompt_lens, max_tokens, strict=True)) > num_blocks:
        raise ValueError("one request alone needs more blocks than the pool has: use a bigger pool")
    free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
    tables: dict[int, list[int]] = {}
    generated = [0] * len(prompt_lens)
    waiting = list(range(len(prompt_lens)))
    running: list[int] = []
    steps: list[BlockStep] = []

    def grow(rid: int, headroom: int = 0) -> bool:
        table = tables.setdefault(rid, [])
        need = _blocks(prompt_lens[rid] + generated[rid], block_size) - len(table)
        if need + headroom > len(free):
            return False
        table.extend(free.popitem(last=False)[0] for _ in range(need))
        return True

    def release(rid: int) -> None:
        for b in reversed(tables.pop(rid)):
            free[b] = None

    while waiting or running:
        scheduled, preempted = [], []
        i = 0
        while i < len(running):
            rid = running[i]
            while not grow(rid):
                victim = running.pop()
                release(victim)
                preempted.append(victim)
                waiting.insert(0, victim)
                if victim == rid:
                    break
            else:
                scheduled.append(rid)
                i += 1
                continue
            break
        while waiting and not preempted and len(running) < max_num_seqs:
            rid = waiting[0]
            if not grow(rid, headroom=len(running)):
                if not tables[rid]:
                    del tables[rid]
                break
            waiting.pop(0)
            running.append(rid)
            scheduled.append(rid)
        snapshot = {r: list(t) for r, t in tables.items()}
        finished = []
        for rid in scheduled:
            generated[rid] += 1
            if generated[rid] >= max_tokens[rid]:
                running.remove(rid)
                release(rid)
                finished.append(rid)
        steps.append(BlockStep(len(steps), tuple(scheduled), snapshot, tuple(preempted),
                               tuple(finished), len(free)))
        if len(steps) > 10_000:
            raise RuntimeError("no progress after 10,000 steps")
    return steps


def _scenario(seed: int, crowded: bool) -> tuple[list[int], list[int], int, int]:
    rng = random.Random(seed)
    n = rng.randint(3, 4)
    prompts = [rng.randint(2, 9) for _ in range(n)]
    outputs = [rng.randint(3, 8) for _ in range(n)]
    block = 4
    need = sum(_blocks(p + m, block) for p, m in zip(prompts, outputs, strict=True))
    if crowded:
        pool = max(max(_blocks(p + m, block) for p, m in zip(prompts, outputs, strict=True)),
                   sum(_blocks(p, block) for p in prompts) + 1, need - rng.randint(3, 5))
    else:
        pool = need + rng.randint(0, 4)
    return prompts, outputs, block, pool


def _describe(prompts, outputs, block, pool) -> str:
    reqs = ", ".join(f"request {i}: {p} prompt tokens, max_tokens {m}"
                     for i, (p, m) in enumerate(zip(prompts, outputs, strict=True)))
    return (f"Block size {block}, a pool of {pool} blocks (ids 0..{pool - 1}, handed out lowest "
            f"first; freed blocks go to the back of the free list). All requests arrive at step 0, "
            f"in this order: {reqs}.")


def block_table_problem(seed: int) -> dict:
    """The scenario of ``make_block_table_exercise(seed)``, to run on the real engine."""
    prompts, outputs, block, pool = _scenario(seed, crowded=False)
    return {"prompt_lens": prompts, "max_tokens": outputs, "block_size": block, "num_blocks": pool}


def make_block_table_exercise(seed: int) -> Exercise:
    """Predict one request's block table during step k. Answer with a list of block ids."""
    p = block_table_problem(seed)
    steps = simulate_block_tables(**p)
    rng = random.Random(seed + 1)
    rid = rng.randrange(len(p["prompt_lens"]))
    k = rng.randint(1, p["max_tokens"][rid] - 1)
    solution = steps[k].block_tables[rid]
    question = (_describe(*p.values()) + f"\nWhat is request {rid}'s block table during step {k} "
                "(steps count from 0; step 0 computes every prompt)? Answer with a list of ints.")
    want = len(solution)

    def diagnose(answer) -> Verdict:
        try:
            got = [int(b) for b in answer]
        except (TypeError, ValueError):
            return Verdict(False, "answer with a list of block ids, e.g. [0, 5].", attempt=False)
        if got == solution:
            return Verdict(True, f"it holds ceil(({p['prompt_lens'][rid]} + {k}) / {p['block_size']}) = "
                                 f"{want} blocks: {solution}.")
        if len(got) != want:
            return Verdict(False, f"during step {k} the request holds its prompt plus the {k} tokens "
                                  f"generated before it: ceil(tokens / block size) blocks, not {len(got)}.")
        if got[: len(steps[0].block_tables[rid])] != steps[0].block_tables[rid]:
            return Verdict(False, "the first blocks come from step 0: requests take their prompt "
                                  "blocks in arrival order from the head of the free list.")
        return Verdict(False, "the count is right; a block added later comes from the head of the "
                              "free list at that step, after the older requests took theirs.")

    return Exercise(seed, question, solution, diagnose,
                    hint="write down each step's allocations, oldest request first.")


def preemption_problem(seed: int) -> dict:
    """The scenario of ``make_preemption_exercise(seed)``: a pool too small for every request."""
    for s in range(seed * 1000, seed * 1000 + 1000):
        prompts, outputs, block, pool = _scenario(s, crowded=True)
        if any(st.preempted for st in simulate_block_tables(prompts, outputs, block, pool)):
            return {"prompt_lens": prompts, "max_tokens": outputs, "block_size": block,
                    "num_blocks": pool}
    raise ValueError(f"no crowded scenario found for seed {seed}")


def make_preemption_exercise(seed: int) -> Exercise:
    """Which request is preempted first, and at which step? Answer ``(request, step)``."""
    p = preemption_problem(seed)
    steps = simulate_block_tables(**p)
    first = next(st for st in steps if st.preempted)
    solution = (first.preempted[0], first.step)
    admitted = steps[0].scheduled
    question = (_describe(*p.values()) + "\nThe pool runs out as requests grow. Which request is "
                "preempted first, and during which step? Answer a pair (request, step).")

    def diagnose(answer) -> Verdict:
        try:
            rid, step = (int(x) for x in answer)
        except (TypeError, ValueError):
            return Verdict(False, "answer with a pair of ints (request, step).", attempt=False)
        if (rid, step) == solution:
            return Verdict(True, f"at step {first.step} a running request needs a block and none is "
                                 f"free; the runner preempts the newest running request, {rid}.")
        if rid != solution[0]:
            newest = "the last one admitted" if rid in admitted else "a running one"
            return Verdict(False, f"the victim is the most recently admitted running request "
                                  f"({newest}), not the one that asked for the block.")
        return Verdict(False, "right request, wrong step: count when the free list first runs dry "
                              "(blocks free after step 0, minus one per request crossing a block).")

    return Exercise(seed, question, solution, diagnose,
                    hint="count free blocks after step 0, then which request needs a new block when.")


def cached_tokens_problem(seed: int) -> dict:
    """A first prompt, then a second sharing its first ``shared`` tokens (prefix caching on)."""
    rng = random.Random(seed)
    block = rng.choice([4, 8])
    first_len = rng.randint(2 * block, 5 * block)
    shared = rng.randint(block - 1, first_len)
    extra = rng.randint(0, 6)
    first = list(range(1, first_len + 1))
    second = first[:shared] + list(range(100, 100 + extra))
    if len(second) == 0:
        second = [100]
    return {"block_size": block, "first": first, "second": second, "shared": shared}


def cached_prompt_tokens(first: list[int], second: list[int], block_size: int) -> int:
    """Prompt tokens of ``second`` served from the cache after ``first`` ran: the full blocks they
    share, but never the last prompt token (its step must run to produce logits)."""
    shared = 0
    while shared < min(len(first), len(second)) and first[shared] == second[shared]:
        shared += 1
    return block_size * min(shared // block_size, (len(second) - 1) // block_size)


def make_cached_tokens_exercise(seed: int) -> Exercise:
    """How many of the second prompt's tokens come from the prefix cache? Answer with an int."""
    p = cached_tokens_problem(seed)
    solution = cached_prompt_tokens(p["first"], p["second"], p["block_size"])
    question = (f"Prefix caching on, block size {p['block_size']}. A first request with a "
                f"{len(p['first'])}-token prompt has finished. A second request's prompt has "
                f"{len(p['second'])} tokens, of which the first {p['shared']} equal the first "
                "request's. How many prompt tokens of the second request are cached?")
    shared_blocks = p["shared"] // p["block_size"] * p["block_size"]

    def diagnose(answer) -> Verdict:
        value = parse_int(answer)
        if value is None or value < 0:
            return Verdict(False, "answer with a non-negative int.", attempt=False)
        if value == solution:
            return Verdict(True, "only full blocks are cached, and the last prompt token is always "
                                 f"computed: {solution} tokens.")
        if value == p["shared"]:
            return Verdict(False, "a partly filled block is never cached: round down to whole blocks.")
        if value == shared_blocks:
            return Verdict(False, "the step that computes the last prompt token produces the logits, "
                                  "so that token is never taken from the cache.")
        if value % p["block_size"]:
            return Verdict(False, "the cache hands out whole blocks: the answer is a multiple of "
                                  "the block size.")
        return Verdict(False, "count the full blocks both prompts share.")

    return Exercise(seed, question, solution, diagnose,
                    hint="only whole shared blocks count, and one prompt token is always computed.")


def slot_mapping_cases(seed: int = 0, num_cases: int = 12) -> list[dict]:
    """Seeded ``dict(block_table, block_size, start, end)`` cases: a shuffled table of distinct block
    ids and a range of positions [start, end) that may start mid-block and cross block boundaries
    (a prefill chunk or a single decode token)."""
    rng = random.Random(seed)
    cases = []
    for i in range(num_cases):
        block_size = rng.choice([1, 2, 4, 8, 16])
        table = rng.sample(range(64), rng.randint(1, 6))
        capacity = len(table) * block_size
        if i % 3 == 0:  # a decode step: one token
            start = rng.randrange(capacity)
            end = start + 1
        else:
            start = rng.randrange(capacity)
            end = rng.randint(start + 1, capacity)
        cases.append(dict(block_table=table, block_size=block_size, start=start, end=end))
    return cases


def slot_mapping_task(reference: Callable[..., list[int]], seed: int = 0) -> ImplementIt:
    """Notebook 03's implement-it: ``slot_mapping(block_table, block_size, start, end)``, the slot of
    every token position in [start, end). ``reference`` is the runner's own answer, passed in."""
    def same(got, want) -> bool:
        return [int(x) for x in got] == [int(x) for x in want]

    return ImplementIt("slot_mapping", reference, slot_mapping_cases(seed), same=same,
                       hint="one slot per position in range(start, end): look its logical block up "
                            "in the table, then add its offset in the block (section 1).")

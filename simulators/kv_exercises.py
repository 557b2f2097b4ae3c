"""Seeded exercises on KV-cache memory (notebook 02) and slot mapping (notebook 03).

Owns the questions and their checkers, and notebook 02's implement-it task (``blocks_needed_task``);
the arithmetic comes from ``simulators.kv_memory``. Never prints a solution by itself
(``Exercise.solution()`` or ``python -m simulators.kv_memory ... -c``), and never imports the runner:
an implement-it reference is passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from simulators.exercises import Exercise, ImplementIt, Verdict, parse_int
from simulators.kv_memory import BYTES_PER_ELEMENT, kv_shape

_DTYPES = ("float16", "bfloat16", "float32", "float8")


def random_config(seed: int, dtype: str | None = None) -> dict:
    """A plausible (seeded) decoder config: layers, heads, KV heads, head_dim, dtype. ``dtype``
    replaces only the cache dtype: the same seed gives the same layers and heads with any dtype."""
    rng = random.Random(seed)
    heads = rng.choice([8, 12, 16, 32, 40, 64])
    kv_heads = rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0])
    head_dim = rng.choice([64, 80, 96, 128])
    layers = rng.choice([12, 16, 24, 28, 32, 40, 48, 60])
    drawn = rng.choice(_DTYPES)
    return {"num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim,
            "hidden_size": heads * head_dim, "torch_dtype": dtype or drawn}


def make_exercise(seed: int, dtype: str | None = None) -> Exercise:
    """KV bytes per token of a random config (``dtype`` forces the cache dtype, e.g. "float8")."""
    if dtype is not None and dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(BYTES_PER_ELEMENT)}")
    config = random_config(seed, dtype)
    shape = kv_shape(config)
    solution = shape.bytes_per_token
    layers, heads, kv_heads = (config[k] for k in ("num_hidden_layers", "num_attention_heads",
                                                   "num_key_value_heads"))
    head_dim, name = config["head_dim"], config["torch_dtype"]
    question = ("How many bytes of KV cache does one token take for this config?\n  "
                + ", ".join(f"{k}={v}" for k, v in config.items()))

    def diagnose(answer) -> Verdict:
        value = parse_int(answer)
        if value is None or value <= 0:
            return Verdict(False, "answer with a positive int number of bytes.", attempt=False)
        if value == solution:
            return Verdict(True, f"2 x {layers} layers x {kv_heads} KV heads x {head_dim} x "
                                 f"{shape.bytes_per_element} bytes ({name}).")
        if value * 2 == solution:
            return Verdict(False, "each token stores a key AND a value: a factor 2 is missing.")
        if kv_heads != heads and value * kv_heads == solution * heads:
            return Verdict(False, "with grouped-query attention only num_key_value_heads heads "
                                  "are cached, not num_attention_heads.")
        if value % solution == 0 or solution % value == 0:
            factor = max(value, solution) // min(value, solution)
            return Verdict(False, f"off by a factor of {factor}: {name} takes "
                                  f"{shape.bytes_per_element} byte(s) per element; check every factor.")
        return Verdict(False, "multiply 2 x layers x kv_heads x head_dim x bytes per element.")

    command = f"python -m simulators.kv_memory bytes -s {seed}" + (f" --dtype {dtype}" if dtype else "")
    return Exercise(seed, question, solution, diagnose,
                    hint="2 x layers x KV heads x head_dim x bytes per element.", command=command)


def make_fit_exercise(seed: int) -> Exercise:
    """How many requests fit when each reserves max_model_len slots? Answer with an int."""
    rng = random.Random(seed)
    config = random_config(seed)
    per_token = kv_shape(config).bytes_per_token
    max_len = rng.choice([2048, 4096, 8192])
    budget_gib = rng.choice([8, 12, 16, 24, 40])
    slots = budget_gib * 2**30 // per_token
    solution = slots // max_len
    question = (f"A server has {budget_gib} GiB for the KV cache of a model with "
                f"{per_token:,d} bytes of KV per token. Each request reserves max_model_len = "
                f"{max_len} slots up front. How many requests can run at once?")

    def diagnose(answer) -> Verdict:
        value = parse_int(answer)
        if value is None or value < 0:
            return Verdict(False, "answer with a non-negative int.", attempt=False)
        if value == solution:
            left = slots - solution * max_len
            return Verdict(True, f"{slots:,d} slots // {max_len} = {solution}; the {left} slots left "
                                 "over are external fragmentation no request can use.")
        if value == -(-slots // max_len):
            return Verdict(False, "round down: a request needs all of its reservation.")
        if value == budget_gib * 10**9 // per_token // max_len:
            return Verdict(False, "a GiB is 2**30 bytes, not 10**9.")
        return Verdict(False, "slots = budget bytes // bytes per token; requests = slots // max_model_len.")

    return Exercise(seed, question, solution, diagnose,
                    hint="turn the budget into token slots first, then divide by max_model_len.",
                    command=f"python -m simulators.kv_memory fit -s {seed}")


def make_slot_exercise(seed: int) -> Exercise:
    """Where does token ``pos`` of a request go? Given its block table and the block size, answer
    with the slot (physical block x block_size + offset in the block)."""
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(3, 6)
    table = rng.sample(range(4, 64), num_blocks)
    pos = rng.randrange(block_size, num_blocks * block_size)  # never in logical block 0
    logical, offset = divmod(pos, block_size)
    solution = table[logical] * block_size + offset
    question = (f"block_size = {block_size}, block_table = {table}.\n"
                f"Which slot holds the KV entry of token position {pos}?")

    def diagnose(answer) -> Verdict:
        value = parse_int(answer)
        if value is None:
            return Verdict(False, "answer with an int slot number.", attempt=False)
        if value == solution:
            return Verdict(True, f"position {pos} is offset {offset} of logical block {logical}, "
                                 f"which is physical block {table[logical]}.")
        if value == pos:
            return Verdict(False, "that is the logical position; map its block through the table.")
        if value == table[logical]:
            return Verdict(False, "that is the physical block; a slot is block x block_size + "
                                  "offset.")
        if value == table[logical] * block_size:
            return Verdict(False, "that is the block's first slot: add the offset pos % block_size.")
        if value in (table[logical - 1] * block_size + offset,
                     *((table[logical + 1] * block_size + offset,) if logical + 1 < num_blocks else ())):
            return Verdict(False, "that is a neighbouring table entry: the logical block is "
                                  "pos // block_size, counted from 0.")
        return Verdict(False, "logical block = pos // block_size, offset = pos % block_size, "
                              "slot = block_table[logical block] x block_size + offset.")

    return Exercise(seed, question, solution, diagnose,
                    hint="logical block = pos // block_size; look it up; add the offset.")


def blocks_needed_cases(seed: int = 0) -> list[dict]:
    """Seeded ``dict(num_tokens, block_size)`` cases for ``blocks_needed``: every block size gets the
    edges a ceiling division gets wrong (0, 1, a multiple of the block, one past it) and random lengths."""
    rng = random.Random(seed)
    cases = []
    for block_size in (1, 4, 16, rng.choice([8, 32, 64])):
        lengths = {0, 1, block_size - 1, block_size, block_size + 1, 3 * block_size,
                   rng.randint(1, 2048), rng.randint(1, 2048)}
        cases += [dict(num_tokens=n, block_size=block_size) for n in sorted(lengths)]
    return cases


def blocks_needed_task(reference: Callable[..., int], seed: int = 0) -> ImplementIt:
    """Notebook 02's implement-it: ``blocks_needed(num_tokens, block_size)``, the blocks a request
    holding ``num_tokens`` KV entries needs. ``reference`` is the runner's own answer, passed in."""
    return ImplementIt("blocks_needed", reference, blocks_needed_cases(seed),
                       same=lambda got, want: parse_int(got) == want,
                       hint="a request holds whole blocks: the fewest blocks whose slots hold "
                            "num_tokens (0 tokens need 0 blocks).")

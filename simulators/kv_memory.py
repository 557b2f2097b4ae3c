"""How much memory the KV cache takes, and how much of it holds real token states.

Owns KV bytes per token for any Hugging Face config, seeded request workloads, and a step-by-step
allocator simulation comparing contiguous reservation (max_model_len, or prompt + max_tokens) with
paged blocks. Pure Python/numpy; it never imports torch and never touches a real KV cache.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulators.exercises import Exercise, Verdict

BYTES_PER_ELEMENT = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "int8": 1,
}

# Config numbers copied from each model's config.json on the Hugging Face Hub (only the fields the
# KV size depends on, plus max_position_embeddings). No network access is needed to use them.
# https://huggingface.co/facebook/opt-13b/blob/main/config.json (multi-head attention: no
# num_key_value_heads field, so every attention head has its own K and V)
OPT_13B = {
    "model_type": "opt", "hidden_size": 5120, "num_attention_heads": 40,
    "num_hidden_layers": 40, "max_position_embeddings": 2048, "torch_dtype": "float16",
}
# https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (grouped-query attention)
LLAMA_3_8B = {
    "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
# https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json (head_dim 128 is explicit and is NOT
# hidden_size / num_attention_heads = 64)
QWEN3_0_6B = {
    "model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28,
    "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
}
MODEL_CONFIGS = {"Qwen3-0.6B": QWEN3_0_6B, "Llama-3-8B": LLAMA_3_8B, "OPT-13B": OPT_13B}


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        value = config.get(name, default)
    else:
        value = getattr(config, name, default)
    return default if value is None else value


@dataclass(frozen=True)
class KVShape:
    """What one token's KV entry is made of: per layer, K and V of ``num_kv_heads x head_dim``."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    bytes_per_element: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_element


def kv_shape(config: Any, dtype: str | None = None) -> KVShape:
    """Read the KV-relevant numbers from a config dict or a ``transformers`` config object.

    head_dim = ``config.head_dim`` when present, else hidden_size / num_attention_heads;
    num_kv_heads = ``num_key_value_heads`` when present, else num_attention_heads (plain MHA).
    ``dtype`` overrides the config's own dtype (``torch_dtype`` or ``dtype``).
    """
    heads = _get(config, "num_attention_heads")
    layers = _get(config, "num_hidden_layers")
    if heads is None or layers is None:
        raise ValueError("config needs num_attention_heads and num_hidden_layers")
    head_dim = _get(config, "head_dim")
    if head_dim is None:
        hidden = _get(config, "hidden_size")
        if hidden is None or hidden % heads:
            raise ValueError("config has no head_dim and hidden_size is not a multiple of heads")
        head_dim = hidden // heads
    kv_heads = _get(config, "num_key_value_heads", heads)
    name = dtype or _get(config, "dtype") or _get(config, "torch_dtype") or "float32"
    name = str(name).replace("torch.", "")
    if name not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown dtype {name!r}; pass dtype= one of {sorted(BYTES_PER_ELEMENT)}")
    return KVShape(int(layers), int(kv_heads), int(head_dim), BYTES_PER_ELEMENT[name])


def kv_bytes_per_token(config: Any, dtype: str | None = None) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    return kv_shape(config, dtype).bytes_per_token


# ---------------------------------------------------------------------------------------------
# workloads


@dataclass(frozen=True)
class WorkloadSpec:
    """Prompt and output lengths drawn from log-normal distributions with the given means.

    ``sigma`` is the standard deviation of the log; lengths are rounded, at least 1, and the output
    is cut so that prompt + output <= max_model_len.
    """

    name: str
    prompt_mean: float
    prompt_sigma: float
    output_mean: float
    output_sigma: float
    max_model_len: int = 2048


# Means from Fig. 11 of the PagedAttention paper (Kwon et al., SOSP'23, arXiv 2309.06180): ShareGPT
# prompts average 161.31 tokens and outputs 337.99; Alpaca 19.31 and 58.45. The shapes (log-normal,
# the sigmas) are our assumption: ShareGPT's conversations are long-tailed, Alpaca's are short.
SHAREGPT_LIKE = WorkloadSpec("ShareGPT-like", 161.31, 1.0, 337.99, 1.0)
ALPACA_LIKE = WorkloadSpec("Alpaca-like", 19.31, 0.6, 58.45, 0.8)


@dataclass(frozen=True)
class Workload:
    """Per-request prompt and output lengths (in tokens)."""

    name: str
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    max_model_len: int

    def __len__(self) -> int:
        return len(self.prompt_lens)


def sample_workload(spec: WorkloadSpec, num_requests: int, seed: int) -> Workload:
    """Draw ``num_requests`` requests from ``spec``; the same seed gives the same workload."""
    rng = np.random.default_rng(seed)

    def draw(mean: float, sigma: float) -> np.ndarray:
        mu = math.log(mean) - sigma**2 / 2  # a log-normal's mean is exp(mu + sigma^2 / 2)
        return np.maximum(1, np.rint(rng.lognormal(mu, sigma, num_requests))).astype(int)

    prompts = np.minimum(draw(spec.prompt_mean, spec.prompt_sigma), spec.max_model_len - 1)
    outputs = np.minimum(draw(spec.output_mean, spec.output_sigma), spec.max_model_len - prompts)
    return Workload(spec.name, tuple(prompts.tolist()), tuple(outputs.tolist()),
                    spec.max_model_len)


# ---------------------------------------------------------------------------------------------
# what one request holds


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks a request of ``num_tokens`` KV entries occupies: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


def paged_slack(num_tokens: int, block_size: int) -> int:
    """Allocated but unfilled slots of a paged request: only its last block can be partly empty."""
    return blocks_needed(num_tokens, block_size) * block_size - num_tokens


def reserved_slots(policy: str, prompt_len: int, max_tokens: int, max_model_len: int) -> int:
    """Slots a contiguous policy reserves up front for one request."""
    if policy == "max_model_len":
        return max_model_len
    if policy == "max_tokens":
        return prompt_len + max_tokens
    raise ValueError(f"unknown reservation policy {policy!r}")


def pow2_max_tokens(prompt_len: int, output_len: int) -> int:
    """max_tokens such that prompt + max_tokens is the next power of two >= prompt + output
    (a client that knows its output length only to within 2x)."""
    total = 1 << (prompt_len + output_len - 1).bit_length()
    return total - prompt_len


# ---------------------------------------------------------------------------------------------
# the allocator simulation


@dataclass
class AllocResult:
    """Averages over the saturated steps (at least one request still waiting after admission, so
    memory is what limits the batch), as shares of the whole KV budget; they sum to 1.

    token: slots holding a KV entry; reservation: reserved for tokens a request will still make;
    internal: allocated but never used (beyond the final length, or the end of the last block);
    external: free slots no waiting request could be given (holes too small, or too few).
    """

    policy: str
    workload: str
    budget_slots: int
    block_size: int | None
    token_share: float
    reservation_share: float
    internal_share: float
    external_share: float
    mean_running: float
    max_running: int
    num_saturated_steps: int
    num_steps: int
    num_preemptions: int
    max_slack_per_request: int  # largest (allocated - tokens - future reservation) seen
    trace: dict = field(default_factory=dict, repr=False)  # per-step arrays, for plots

    @property
    def waste_share(self) -> float:
        return 1.0 - self.token_share

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "trace"}
        d["waste_share"] = self.waste_share
        return d


class _FirstFit:
    """Contiguous allocation in one address range [0, size): first hole big enough wins."""

    def __init__(self, size: int):
        self.size = size
        self.blocks: dict[int, tuple[int, int]] = {}  # request -> (start, length)

    def alloc(self, rid: int, length: int) -> bool:
        start = 0
        for s, n in sorted(self.blocks.values()):
            if s - start >= length:
                break
            start = s + n
        if start + length > self.size:
            return False
        self.blocks[rid] = (start, length)
        return True

    def free(self, rid: int) -> None:
        del self.blocks[rid]


def simulate_allocator(
    workload: Workload,
    budget_slots: int,
    policy: str,
    block_size: int = 16,
    max_tokens: str | int = "oracle",
    record_trace: bool = False,
) -> AllocResult:
    """Serve ``workload`` (all requests waiting at step 0, first come first served) with a KV
    budget of ``budget_slots`` token slots and report how the memory was used.

    Step model: a request admitted at a step holds its prompt's KV; each later step adds one
    token; it finishes when it holds prompt + output tokens and frees its memory.

    policy "max_model_len": reserve max_model_len contiguous slots per request.
    policy "max_tokens": reserve prompt + max_tokens contiguous slots (Orca-style); ``max_tokens``
    is "oracle" (exactly the output length), "pow2" (round prompt + output up to a power of two) or
    an int cap every request sends (outputs longer than the cap are cut to it).
    policy "paged": blocks of ``block_size`` slots allocated as tokens arrive; when a request needs
    a block and none is free, the most recently admitted request is preempted (its blocks freed; it
    goes back to the head of the queue and later resumes with the tokens it had).
    """
    if policy not in ("max_model_len", "max_tokens", "paged"):
        raise ValueError(f"unknown policy {policy!r}: max_model_len, max_tokens or paged")
    prompts = list(workload.prompt_lens)
    outputs = list(workload.output_lens)
    if isinstance(max_tokens, int):
        outputs = [min(o, max_tokens) for o in outputs]
        caps = [max_tokens] * len(prompts)
    elif max_tokens == "oracle":
        caps = list(outputs)
    elif max_tokens == "pow2":
        caps = [pow2_max_tokens(p, o) for p, o in zip(prompts, outputs, strict=True)]
    else:
        raise ValueError(f"max_tokens must be 'oracle', 'pow2' or an int, got {max_tokens!r}")
    final = [p + o for p, o in zip(prompts, outputs, strict=True)]
    paged = policy == "paged"
    if paged:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        num_blocks = budget_slots // block_size
        reserve = [blocks_needed(f, block_size) * block_size for f in final]  # only for the check
    else:
        reserve = [reserved_slots(policy, p, c, workload.max_model_len)
                   for p, c in zip(prompts, caps, strict=True)]
    too_big = max(reserve) if not paged else blocks_needed(max(final), block_size) * block_size
    if too_big > budget_slots:
        raise ValueError(f"one request needs {too_big} slots but the budget is {budget_slots}")

    waiting = list(range(len(prompts)))  # queue, head first
    running: list[int] = []  # admission order
    tokens = [0] * len(prompts)
    blocks = [0] * len(prompts)
    free_blocks = num_blocks if paged else 0
    ff = None if paged else _FirstFit(budget_slots)
    sums = {"token": 0, "reservation": 0, "internal": 0, "external": 0, "running": 0}
    per_step: dict[str, list] = {k: [] for k in ("token", "reservation", "internal", "external",
                                                 "running", "saturated")}
    saturated_steps = max_running = preemptions = max_slack = step = 0

    while waiting or running:
        while waiting:  # admission, FCFS: stop at the first request that does not fit
            rid = waiting[0]
            n = tokens[rid] or prompts[rid]
            if paged:
                need = blocks_needed(n, block_size)
                if need > free_blocks:
                    break
                free_blocks -= need
                blocks[rid] = need
            elif not ff.alloc(rid, reserve[rid]):
                break
            tokens[rid] = n
            running.append(rid)
            waiting.pop(0)
        tok = sum(tokens[r] for r in running)
        if paged:
            alloc = sum(blocks[r] for r in running) * block_size
            res, internal = 0, alloc - tok
            slack = max((blocks[r] * block_size - tokens[r] for r in running), default=0)
        else:
            alloc = sum(reserve[r] for r in running)
            res = sum(final[r] - tokens[r] for r in running)
            internal = alloc - tok - res
            slack = max((reserve[r] - final[r] for r in running), default=0)
        max_slack = max(max_slack, slack)
        ext = budget_slots - alloc
        saturated = bool(waiting)
        if saturated:
            saturated_steps += 1
            for k, v in (("token", tok), ("reservation", res), ("internal", internal),
                         ("external", ext), ("running", len(running))):
                sums[k] += v
            max_running = max(max_running, len(running))
        if record_trace:
            for k, v in (("token", tok), ("reservation", res), ("internal", internal),
                         ("external", ext), ("running", len(running)), ("saturated", saturated)):
                per_step[k].append(v)

        # advance one step: finished requests free their memory, the others grow by one token
        still = []
        for rid in running:
            if tokens[rid] >= final[rid]:
                if paged:
                    free_blocks += blocks[rid]
                else:
                    ff.free(rid)
            else:
                still.append(rid)
        running = still
        if paged:
            i = 0
            while i < len(running):
                rid = running[i]
                if blocks_needed(tokens[rid] + 1, block_size) > blocks[rid]:
                    while free_blocks == 0:
                        victim = running.pop()  # the most recently admitted request
                        free_blocks += blocks[victim]
                        blocks[victim] = 0
                        waiting.insert(0, victim)
                        preemptions += 1
                        if victim == rid:
                            break
                    if blocks[rid] == 0:  # rid preempted itself; it resumes later
                        break
                    free_blocks -= 1
                    blocks[rid] += 1
                tokens[rid] += 1
                i += 1
        else:
            for rid in running:
                tokens[rid] += 1
        step += 1

    denom = max(saturated_steps, 1) * budget_slots
    trace = {k: np.asarray(v) for k, v in per_step.items()} if record_trace else {}
    return AllocResult(
        policy=policy if policy != "max_tokens" else f"max_tokens ({max_tokens})",
        workload=workload.name,
        budget_slots=budget_slots,
        block_size=block_size if paged else None,
        token_share=sums["token"] / denom,
        reservation_share=sums["reservation"] / denom,
        internal_share=sums["internal"] / denom,
        external_share=sums["external"] / denom,
        mean_running=sums["running"] / max(saturated_steps, 1),
        max_running=max_running,
        num_saturated_steps=saturated_steps,
        num_steps=step,
        num_preemptions=preemptions,
        max_slack_per_request=max_slack,
        trace=trace,
    )


def block_size_sweep(workload: Workload, budget_slots: int,
                     block_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> list[dict]:
    """Paged simulation for each block size: token share, waste and mean batch size."""
    rows = []
    for b in block_sizes:
        r = simulate_allocator(workload, budget_slots, "paged", block_size=b)
        rows.append({"block_size": b, "token_share": r.token_share,
                     "internal_share": r.internal_share, "external_share": r.external_share,
                     "mean_running": r.mean_running, "num_preemptions": r.num_preemptions})
    return rows


# ---------------------------------------------------------------------------------------------
# exercises


def make_exercise(seed: int) -> Exercise:
    """KV bytes per token of a random (plausible) model config. Answer with an int."""
    rng = random.Random(seed)
    heads = rng.choice([8, 12, 16, 32, 40, 64])
    kv_heads = rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0])
    head_dim = rng.choice([64, 80, 96, 128])
    layers = rng.choice([12, 16, 24, 28, 32, 40, 48, 60])
    dtype = rng.choice(["float16", "bfloat16", "float32", "float8"])
    config = {"num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim,
              "hidden_size": heads * head_dim, "torch_dtype": dtype}
    shape = kv_shape(config)
    solution = shape.bytes_per_token
    question = ("How many bytes of KV cache does one token take for this config?\n  "
                + ", ".join(f"{k}={v}" for k, v in config.items()))

    def diagnose(answer) -> Verdict:
        try:
            value = int(answer)
        except (TypeError, ValueError):
            return Verdict(False, "answer with an int number of bytes.")
        if value == solution:
            return Verdict(True, f"2 x {layers} layers x {kv_heads} KV heads x {head_dim} x "
                                 f"{shape.bytes_per_element} bytes.")
        if value * 2 == solution:
            return Verdict(False, "each token stores a key AND a value: a factor 2 is missing.")
        if kv_heads != heads and value * kv_heads == solution * heads:
            return Verdict(False, "with grouped-query attention only num_key_value_heads heads "
                                  "are cached, not num_attention_heads.")
        if value % solution == 0 or solution % value == 0:
            factor = max(value, solution) // min(value, solution)
            return Verdict(False, f"off by a factor of {factor}: check the bytes per element "
                                  f"of {dtype} and every other factor.")
        return Verdict(False, "multiply 2 x layers x kv_heads x head_dim x bytes per element.")

    return Exercise(seed, question, solution, diagnose)


def make_slot_exercise(seed: int) -> Exercise:
    """Where does token ``pos`` of a request go? Given its block table and the block size, answer
    with the slot (physical block x block_size + offset in the block)."""
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(3, 6)
    table = rng.sample(range(4, 64), num_blocks)
    pos = rng.randrange(block_size, num_blocks * block_size)
    logical, offset = divmod(pos, block_size)
    solution = table[logical] * block_size + offset
    question = (f"block_size = {block_size}, block_table = {table}.\n"
                f"Which slot holds the KV entry of token position {pos}?")

    def diagnose(answer) -> Verdict:
        try:
            value = int(answer)
        except (TypeError, ValueError):
            return Verdict(False, "answer with an int slot number.")
        if value == solution:
            return Verdict(True, f"position {pos} is offset {offset} of logical block {logical}, "
                                 f"which is physical block {table[logical]}.")
        if value == pos:
            return Verdict(False, "that is the logical position; map its block through the table.")
        if value == logical * block_size + offset:
            return Verdict(False, "that uses the logical block number; look it up in the table.")
        if value == table[logical]:
            return Verdict(False, "that is the physical block; a slot is block x block_size + "
                                  "offset.")
        return Verdict(False, "logical block = pos // block_size, offset = pos % block_size, "
                              "slot = block_table[logical block] x block_size + offset.")

    return Exercise(seed, question, solution, diagnose)

"""How much memory the KV cache takes, and what one request holds under each reservation policy.

Owns KV bytes per token for any Hugging Face config, seeded request workloads and per-request slot
arithmetic (blocks, buddy rounding). The step-by-step allocator simulation is ``kv_allocator``, the
exercises ``kv_exercises``, the command line ``kv_cli`` (``python -m simulators.kv_memory``).
Pure Python/numpy; it never imports torch and never touches a real KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1): what a buddy allocator hands out for n slots."""
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def buddy_reservation(prompt_len: int, max_tokens: int, max_model_len: int) -> int:
    """Slots a buddy allocator reserves for prompt + max_tokens: rounded up to a power of two, but
    never more than max_model_len (a request cannot grow past it)."""
    return min(next_pow2(prompt_len + max_tokens), max_model_len)




# ---------------------------------------------------------------------------------------------
# capacity: what fits on a device (notebook 02's arithmetic, shared by the rooflines of 04, 06 and 07)

# an H200's memory as torch reported it on the GPU run (benchmarks/results/gpu_run.json: "139.8 GiB");
# the datasheet says 141 GB
H200_BYTES = 139.8 * 2**30


def kv_token_slots(device_bytes: float, weight_bytes: float, kv_bytes_per_token: float, tp: int = 1) -> int:
    """KV token slots left on ``tp`` devices of ``device_bytes`` each once the weights are loaded:
    (tp x device - weights) // KV bytes per token (tensor parallelism splits both the weights and the KV
    heads over the devices). 0 when the weights alone do not fit. Activations and the runtime's own
    memory are left out, so this is an upper bound."""
    if device_bytes <= 0 or kv_bytes_per_token <= 0 or tp < 1:
        raise ValueError("device_bytes and kv_bytes_per_token must be > 0 and tp >= 1")
    free = tp * device_bytes - weight_bytes
    return max(0, int(free // kv_bytes_per_token))


def max_batch(device_bytes: float, weight_bytes: float, kv_bytes_per_token: float, context: int,
              tp: int = 1) -> int:
    """The largest batch of requests holding ``context`` tokens each whose KV fits beside the weights
    (0: not even one). A batch curve stops here: past it the requests wait or are preempted."""
    if context <= 0:
        raise ValueError(f"context must be >= 1 token, got {context}")
    return kv_token_slots(device_bytes, weight_bytes, kv_bytes_per_token, tp) // context


def min_tp(device_bytes: float, weight_bytes: float, kv_bytes_per_token: float, context: int,
           batch: int = 1) -> int:
    """The smallest power-of-two tensor-parallel degree whose devices hold the weights and ``batch``
    requests of ``context`` tokens (rows for such a model are "per GPU under TP = N")."""
    tp = 1
    while max_batch(device_bytes, weight_bytes, kv_bytes_per_token, context, tp) < batch:
        tp *= 2
        if tp > 1024:
            raise ValueError("the model does not fit on 1024 devices")
    return tp


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``python -m simulators.kv_memory --help``); see ``simulators.kv_cli``."""
    from simulators.kv_cli import main as cli_main  # late: the CLI imports the allocator, which imports us

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())

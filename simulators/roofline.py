"""The decode roofline with the KV term (notebook 04): bytes and FLOPs of one decode step, its two time
floors, the batch where it turns compute-bound, and the roofline exercises built on them.

Owns the model: bytes per step = weights + batch x context x KV bytes per token (notebook 02's
``kv_bytes_per_token``); FLOPs per step = 2 x parameters x batch (the matmuls) + 4 x attention heads x
head_dim x layers x context x batch (q.k and p.v over the context). Pure Python; figures come in as numbers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from simulators.exercises import Exercise, ImplementIt, Verdict, parse_choice, parse_float

__all__ = ["DecodeModel", "roofline_step", "step_bytes", "step_flops", "floors_us", "saturation_batch",
           "attention_intensity", "make_floor_exercise", "make_floor_task", "make_saturation_exercise"]


@dataclass(frozen=True)
class DecodeModel:
    """What the roofline needs of a model: parameters, bytes per parameter, layers, attention (query)
    heads, head_dim, and KV bytes per token (2 x layers x KV heads x head_dim x bytes per element)."""

    name: str
    params: float
    bytes_per_param: float
    layers: int
    heads: int
    head_dim: int
    kv_bytes_per_token: int

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param


def roofline_step(params: int, bytes_per_param: float, tokens: int, bandwidth: float,
                  peak_flops: float, kv_bytes: float = 0.0, attention_flops: float = 0.0) -> dict:
    """One forward step that reads ``params`` weights once and multiplies ``tokens`` tokens by them.

    bytes = params x bytes_per_param + kv_bytes (the KV cache the step's attention reads: batch x context
    x KV bytes per token); FLOPs = 2 x params x tokens (a multiply and an add per weight per token) +
    attention_flops; intensity = FLOPs / byte. memory_s and compute_s are the times the two limits allow
    (bandwidth in bytes/s, peak in FLOP/s); the step takes at least the larger (the roofline: launch
    overhead comes on top). bound: which one sets it."""
    if tokens < 1 or params < 1 or bandwidth <= 0 or peak_flops <= 0 or kv_bytes < 0 or attention_flops < 0:
        raise ValueError("tokens and params must be >= 1, bandwidth and peak_flops > 0, kv_bytes and "
                         "attention_flops >= 0")
    weight_bytes = params * bytes_per_param
    total_bytes = weight_bytes + kv_bytes
    flops = 2.0 * params * tokens + attention_flops
    memory_s, compute_s = total_bytes / bandwidth, flops / peak_flops
    return dict(bytes=total_bytes, weight_bytes=weight_bytes, kv_bytes=kv_bytes, flops=flops,
                intensity=flops / total_bytes, memory_s=memory_s, compute_s=compute_s,
                step_s=max(memory_s, compute_s), bound="memory" if memory_s >= compute_s else "compute")


def _step(m: DecodeModel, batch: int, context: int, kv: bool) -> dict:
    kv_bytes = batch * context * m.kv_bytes_per_token if kv else 0
    attention = 4 * m.heads * m.head_dim * m.layers * context * batch if kv else 0
    return roofline_step(m.params, m.bytes_per_param, batch, 1.0, 1.0, kv_bytes=kv_bytes,
                         attention_flops=attention)


def step_bytes(m: DecodeModel, batch: int, context: int, kv: bool = True) -> float:
    """Bytes one decode step reads: every weight once, and each sequence's KV cache (``kv=False``: the
    weights only, the textbook simplification)."""
    return _step(m, batch, context, kv)["bytes"]


def step_flops(m: DecodeModel, batch: int, context: int, kv: bool = True) -> float:
    """FLOPs of one decode step: 2 per parameter per row, plus attention's q.k and p.v over the context."""
    return _step(m, batch, context, kv)["flops"]


def floors_us(m: DecodeModel, batch: int, context: int, bandwidth: float, peak: float,
              kv: bool = True) -> tuple[float, float]:
    """(bytes floor, compute floor) in µs: bytes / bandwidth and FLOPs / peak (bytes/s, FLOP/s)."""
    return (step_bytes(m, batch, context, kv) / bandwidth * 1e6,
            step_flops(m, batch, context, kv) / peak * 1e6)


def attention_intensity(m: DecodeModel, context: int) -> float:
    """FLOPs per byte of attention alone in a decode step: each sequence reads its own KV, so the batch
    cancels out (2 x query heads / KV heads / bytes per element)."""
    return (4 * m.heads * m.head_dim * m.layers * context) / (context * m.kv_bytes_per_token)


def saturation_batch(m: DecodeModel, context: int, bandwidth: float, peak: float,
                     kv: bool = True) -> float:
    """The batch at which the compute floor reaches the bytes floor (math.inf: never, when the KV bytes
    grow with the batch at least as fast as the FLOPs, relative to the ridge point)."""
    ridge = peak / bandwidth
    per_row = step_flops(m, 1, context, kv) - ridge * (step_bytes(m, 1, context, kv) - m.weight_bytes)
    return math.inf if per_row <= 0 else ridge * m.weight_bytes / per_row


# ---------------------------------------------------------------------------------------------
# exercises (notebook 04)

_GPUS = (("an H200 (4.8 TB/s, 989 TFLOP/s bf16)", 4.8e12, 989e12),
         ("an H100 SXM (3.35 TB/s, 989 TFLOP/s bf16)", 3.35e12, 989e12))


def _random_case(rng: random.Random) -> dict:
    layers, kv_heads = rng.choice((16, 28, 32)), rng.choice((2, 4, 8))
    params = rng.choice((0.5, 1.0, 3.0, 8.0)) * 1e9
    return {"params": params, "bytes_per_param": 2.0, "kv_bytes_per_token": 2 * layers * kv_heads * 128 * 2,
            "batch": rng.choice((1, 8, 64, 256, 1024)), "context": rng.choice((16, 128, 1024, 4096)),
            "bandwidth": _GPUS[rng.randrange(2)][1], "peak": 989e12, "flops_per_token": 2 * params}


def make_floor_exercise(seed: int) -> Exercise:
    """Compute: the bytes floor of one decode step, KV included, in µs."""
    rng = random.Random(seed)
    name, bw, _ = _GPUS[rng.randrange(2)]
    params = rng.choice((0.6, 1.7, 4.0, 8.0))
    layers, kv_heads = rng.choice((28, 32, 36)), rng.choice((4, 8))
    kv = 2 * layers * kv_heads * 128 * 2
    batch, context = rng.choice((8, 16, 32, 64)), rng.choice((1024, 2048, 4096))
    weights = params * 1e9 * 2
    kv_total = batch * context * kv
    answer = (weights + kv_total) / bw * 1e6
    question = (f"A {params}B-parameter model in bf16 ({layers} layers, {kv_heads} KV heads of head_dim 128) "
                f"decodes a batch of {batch} sequences of {context} tokens each on {name}. What is the "
                "step's bytes floor in µs?")

    def diagnose(a) -> Verdict:
        v = parse_float(a)
        if v is None:
            return Verdict(False, "answer with a number of microseconds", attempt=False)
        if abs(v - answer) <= 0.01 * answer:
            return Verdict(True, f"{weights / 1e9:.2f} GB of weights + {kv_total / 1e9:.2f} GB of KV, "
                                 f"over the bandwidth: {answer:.0f} µs")
        if abs(v - weights / bw * 1e6) <= 0.01 * answer:
            return Verdict(False, "that is the weights alone: each sequence also reads its whole KV cache")
        if abs(v - (weights + kv_total / 2) / bw * 1e6) <= 0.01 * answer:
            return Verdict(False, "that counts K or V, not both")
        return Verdict(False, "recompute the bytes read per step and divide by the bandwidth")

    return Exercise(seed, question, answer, diagnose,
                    hint="bytes = parameters x 2 + batch x context x (2 x layers x KV heads x head_dim x 2); "
                         "floor = bytes / bandwidth.")


def _floor_reference(params, bytes_per_param, kv_bytes_per_token, batch, context, bandwidth, peak,
                     flops_per_token):
    mem = (params * bytes_per_param + batch * context * kv_bytes_per_token) / bandwidth * 1e6
    comp = flops_per_token * batch / peak * 1e6
    return (max(mem, comp), "bandwidth" if mem >= comp else "compute")


def make_floor_task(seed: int = 0, num_cases: int = 16) -> ImplementIt:
    """Implement it: ``decode_floor(params, bytes_per_param, kv_bytes_per_token, batch, context,
    bandwidth, peak, flops_per_token)`` -> (floor µs, "bandwidth" or "compute"), KV reads included."""
    rng = random.Random(seed)
    cases = [  # by hand first: weights only (context 0), then KV that outweighs the weights
        {"params": 1e9, "bytes_per_param": 2.0, "kv_bytes_per_token": 100_000, "batch": 1, "context": 0,
         "bandwidth": 1e12, "peak": 1e15, "flops_per_token": 2e9},
        {"params": 1e9, "bytes_per_param": 2.0, "kv_bytes_per_token": 100_000, "batch": 32, "context": 4096,
         "bandwidth": 1e12, "peak": 1e15, "flops_per_token": 2e9},
        {"params": 1e9, "bytes_per_param": 2.0, "kv_bytes_per_token": 1_000, "batch": 512, "context": 16,
         "bandwidth": 1e12, "peak": 1e14, "flops_per_token": 2e9}]
    while len(cases) < num_cases:
        cases.append(_random_case(rng))

    def same(got, want):
        try:
            floor, bound = got
            return abs(float(floor) - want[0]) <= 1e-6 * want[0] and bound == want[1]
        except (TypeError, ValueError):
            return False

    return ImplementIt("decode_floor", _floor_reference, cases, same=same,
                       hint="bytes = weights + batch x context x KV bytes per token; the floor is the larger "
                            "of bytes / bandwidth and FLOPs / peak, in µs; say which one it is.")


def make_saturation_exercise(seed: int) -> Exercise:
    """Predict: from which batch does this model's decode turn compute-bound on an H200 at this context?
    Four options, each what one reading of the roofline gives: weights only, K or V counted once, the
    KV term in full, and "from batch 1"."""
    rng = random.Random(seed)
    bw, peak = 4.8e12, 989e12
    while True:
        params, layers, heads, kv_heads = rng.choice(((0.6e9, 28, 16, 8), (8e9, 32, 32, 8),
                                                      (70e9, 80, 64, 8), (14e9, 40, 40, 8)))
        context = rng.choice((64, 256, 1024, 4096))
        m = DecodeModel(f"{params / 1e9:g}B", params, 2, layers, heads, 128, 2 * layers * kv_heads * 128 * 2)
        half = DecodeModel(m.name, params, 2, layers, heads, 128, m.kv_bytes_per_token // 2)
        values = {"weights only": saturation_batch(m, context, bw, peak, kv=False),
                  "K or V once": saturation_batch(half, context, bw, peak),
                  "KV in full": saturation_batch(m, context, bw, peak), "batch 1": 1.0}
        shown = {k: "never" if math.isinf(v) else f"about {round(v)}" for k, v in values.items()}
        if len(set(shown.values())) == 4:
            break
    keys = list(shown)
    rng.shuffle(keys)
    options = dict(zip("abcd", keys, strict=True))
    solution = next(c for c, k in options.items() if k == "KV in full")
    lines = "\n".join(f"  ({c}) {shown[k]}" for c, k in options.items())
    question = (f"A {m.name}-parameter model in bf16 ({layers} layers, {heads} query heads and {kv_heads} "
                f"KV heads of head_dim 128) decodes sequences of {context} tokens on an H200 (4.8 TB/s, "
                "989 TFLOP/s). From which batch size is its step's compute floor at least its bytes floor? "
                f"Answer a letter.\n{lines}")
    why = {"weights only": "that is the ridge point with the weights alone: each sequence also brings its "
                           "KV bytes",
           "K or V once": "that counts K or V, not both: a token's KV bytes are 2 x layers x KV heads x "
                          "head_dim x 2 bytes",
           "batch 1": "at batch 1 the weights are read for one row: decode's intensity is about 1 FLOP per "
                      "byte",
           "KV in full": "the bytes grow with the batch too, so the crossing moves out — or never comes"}

    def diagnose(a) -> Verdict:
        c = parse_choice(a, options)
        if c is None:
            return Verdict(False, f"answer one letter of {''.join(options)}", attempt=False)
        return Verdict(c == solution, why[options[c]])

    return Exercise(seed, question, solution, diagnose,
                    hint="set 2 x params x B + attention FLOPs equal to ridge x (weights + B x context x KV "
                         "bytes per token) and solve for B; if the B terms cancel or go negative, it never "
                         "crosses.")

"""Speculative decoding by arithmetic: what a step reads and computes, and how many tokens a pass emits.

Owns the roofline of one decode or verify step of a Llama-family model (weight bytes read, FLOPs,
arithmetic intensity, the time each bound allows), the speed-up of speculation under that model, and
seeded questions on E[tokens per target pass] = (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023) with a
checker that explains wrong answers. Pure Python; imports nothing of ours but the exercise shapes; a
model's shape comes in as its config.json dict. ``python -m simulators.speculative -s SEED [-c]`` prints
the question (and answer).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from simulators.exercises import Exercise, Verdict, parse_float
from simulators.roofline import roofline_step


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of a Llama-family decoder that set its weight bytes and FLOPs per token."""

    hidden: int
    intermediate: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, cfg: dict) -> DecoderShape:
        """From a Hugging Face config.json dict (head_dim defaults to hidden / heads)."""
        heads = cfg["num_attention_heads"]
        return cls(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], heads,
                   cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   cfg["vocab_size"])

    @property
    def matmul_params(self) -> int:
        """Weights every token is multiplied by: q/k/v/o, gate/up/down of each layer, and the lm_head
        (the embedding lookup reads one row, so it is left out; norms are negligible)."""
        attn = self.hidden * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + self.vocab * self.hidden

    def kv_bytes_per_token(self, bytes_per_el: float = 2) -> float:
        """K and V of one token in every layer: 2 x layers x kv_heads x head_dim x bytes (notebook 02)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_el

    def attention_flops_per_token(self, context: int) -> float:
        """QK^T and PV of one query token against ``context`` cached tokens: 2 x 2 x context x q_heads x
        head_dim per layer (a multiply and an add each)."""
        return 4.0 * self.layers * self.q_heads * self.head_dim * context

    def step(self, batch: int, tokens_per_request: int, context: int, bandwidth: float, peak_flops: float,
             bytes_per_param: float = 2) -> dict:
        """The roofline of one step of ``batch`` requests, each scoring ``tokens_per_request`` tokens
        against ``context`` cached tokens: bytes = weights + batch x context x KV bytes per token, FLOPs =
        2 x weights x tokens + attention's (see :func:`roofline_step`)."""
        tokens = batch * tokens_per_request
        return roofline_step(self.matmul_params, bytes_per_param, tokens, bandwidth, peak_flops,
                             kv_bytes=batch * context * self.kv_bytes_per_token(bytes_per_param),
                             attention_flops=tokens * self.attention_flops_per_token(context))


def roofline_speedup(alpha: float, k: int, target, draft, batch: int, bytes_per_param: float,
                     bandwidth: float, peak_flops: float, context: int = 0) -> float:
    """Speed-up of speculation over plain decoding when every step sits on the roofline (no overhead).

    ``target``/``draft``: a :class:`DecoderShape` (the KV term and attention FLOPs at ``context`` cached
    tokens count) or a bare weight count (weights only). Plain: one target step of ``batch`` tokens per
    emitted token. Speculative: k draft steps of ``batch`` tokens and one target step of batch x (k + 1)
    tokens per (1 - a^(k+1)) / (1 - a) tokens. Memory-bound verify steps make the k + 1 tokens almost
    free; compute-bound ones do not."""
    if k == 0:
        return 1.0

    def step(model, tokens_per_request: int) -> float:
        if isinstance(model, DecoderShape):
            return model.step(batch, tokens_per_request, context, bandwidth, peak_flops,
                              bytes_per_param)["step_s"]
        return roofline_step(model, bytes_per_param, batch * tokens_per_request, bandwidth,
                             peak_flops)["step_s"]

    plain = step(target, 1)
    spec = k * step(draft, 1) + step(target, k + 1)
    return tokens_per_pass(alpha, k) * plain / spec


def split_host_cost(step_a_s: float, ops_a: int, step_b_s: float, ops_b: int) -> tuple[float, float]:
    """Two engines that run the same per-step engine code over models of ``ops_a`` and ``ops_b``
    operators, whose steps cost ``step_a_s`` and ``step_b_s`` on one clock: solve step = engine + ops x
    per_op for (per_op seconds per operator, engine seconds per step). The overhead model of notebook 06."""
    if ops_a == ops_b:
        raise ValueError("the two engines need different operator counts")
    per_op = (step_a_s - step_b_s) / (ops_a - ops_b)
    return per_op, step_a_s - ops_a * per_op


def tokens_per_pass(alpha: float, k: int) -> float:
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def make_exercise(seed: int) -> Exercise:
    """A per-token acceptance a and k drafts per step: answer with the expected tokens per target pass
    (a float; within 0.01 counts)."""
    rng = random.Random(seed)
    alpha = rng.choice([0.5, 0.6, 0.7, 0.77, 0.8, 0.9])
    k = rng.randint(2, 7)
    solution = round(tokens_per_pass(alpha, k), 4)
    question = (f"A draft's tokens are accepted with probability a = {alpha}, independently, and each "
                f"step proposes k = {k} drafts.\nHow many tokens does one target pass emit on average?")

    def diagnose(answer) -> Verdict:
        value = parse_float(answer)
        if value is None:
            return Verdict(False, "answer with a number.")
        if abs(value - solution) < 0.01:
            return Verdict(True, f"(1 - {alpha}^{k + 1}) / (1 - {alpha}) = {solution}: the j-th "
                                 f"draft survives with probability {alpha}^j.")
        if abs(value - alpha * k) < 0.01:
            return Verdict(False, "a * k counts drafts as if each were tested independently; a draft "
                                  "after a rejection is never used, and the target adds one token.")
        if abs(value - (solution - 1)) < 0.01:
            return Verdict(False, "that is the accepted drafts only; the target always emits one more "
                                  "token (the recovered or the bonus one).")
        return Verdict(False, "P(the step emits >= i tokens) = a^(i-1); add these up for i = 1..k+1.")

    hint = ("the step emits the accepted prefix of the drafts plus one token of the target's own; sum "
            "P(at least i tokens) over i = 1..k+1.")
    return Exercise(seed, question, solution, diagnose, hint=hint,
                    command=f"python -m simulators.speculative -s {seed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-s", "--seed", type=int, default=0)
    parser.add_argument("-c", "--compute", action="store_true", help="print the answer")
    args = parser.parse_args()
    ex = make_exercise(args.seed)
    print(ex)
    if args.compute:
        print("answer:", ex.solution())


if __name__ == "__main__":
    main()

"""Seeded benchmark workloads: which prompts, and how many tokens each request generates.

Owns the length distributions (token ids are random in [3, vocab)): nano-vllm's uniform ranges,
ShareGPT-like and Alpaca-like log-normal lengths with the vLLM paper's means, and fixed lengths; and two
text workloads for speculative decoding, whose drafts need real text to be right: ``text`` (play openings
in the embedded model's style) and ``repetitive`` (a passage the prompt already holds twice, continued:
what n-gram lookup is for). Never runs a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The vLLM paper's dataset means (Kwon et al., SOSP 2023, §6.1, Fig. 11): input / output tokens. The paper's
# models allow 2048 tokens, so the means are scaled by max_model_len / 2048 for a model with another limit.
# The log-normal shape and its sigmas are our assumption (the same as simulators.kv_memory's specs).
PAPER_MAX_LEN = 2048
DISTRIBUTIONS = {
    "sharegpt": dict(prompt_mean=161.31, prompt_sigma=1.0, output_mean=337.99, output_sigma=1.0),
    "alpaca": dict(prompt_mean=19.31, prompt_sigma=0.6, output_mean=58.45, output_sigma=0.8),
}
TEXT_PROMPTS = ["ROMEO:\nBut soft, what light through yonder window breaks?",
                "KING HENRY:\nOnce more unto the breach, dear friends, once more;",
                "HAMLET:\nTo be, or not to be, that is the question:",
                "First Citizen:\nBefore we proceed any further, hear me speak."]
_PASSAGE = ("KING RICHARD:\nA horse! a horse! my kingdom for a horse!\nCATESBY:\nWithdraw, my lord; "
            "I'll help you to a horse.\n")
REPETITIVE_PROMPTS = [_PASSAGE * 2 + _PASSAGE[:n] for n in (14, 30, 52, 70)]
TEXT_WORKLOADS = {"text": TEXT_PROMPTS, "repetitive": REPETITIVE_PROMPTS}
WORKLOADS = ("nano", "sharegpt", "alpaca", "fixed", *TEXT_WORKLOADS)


@dataclass(frozen=True)
class Workload:
    """prompts[i]: token ids of request i; max_tokens[i]: tokens it generates (EOS ignored)."""

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    description: str

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)


def make_workload(name: str, num_requests: int, vocab_size: int, max_model_len: int, seed: int = 0,
                  input_len: tuple[int, int] = (100, 1024), output_len: tuple[int, int] = (100, 1024),
                  tokenizer=None) -> Workload:
    """``nano``: lengths uniform in input_len / output_len (inclusive; nano-vllm's bench uses 100–1024 for
    both); ``fixed``: every request input_len[0] in, output_len[0] out; ``sharegpt`` / ``alpaca``:
    log-normal lengths with the paper's means scaled to max_model_len; ``text`` / ``repetitive``: the
    prompts of TEXT_WORKLOADS in turn (encoded with ``tokenizer``), output_len[0] tokens each. Every
    length is clipped so prompt + output fits max_model_len."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {list(WORKLOADS)}")
    if num_requests < 1:
        raise ValueError("a workload needs at least one request")
    if name in TEXT_WORKLOADS:
        return _text_workload(name, num_requests, max_model_len, output_len[0], tokenizer)
    rng = np.random.default_rng(seed)
    if name == "nano":
        prompt_lens = rng.integers(input_len[0], input_len[1] + 1, num_requests)
        output_lens = rng.integers(output_len[0], output_len[1] + 1, num_requests)
        desc = f"{num_requests} requests, input U[{input_len[0]}, {input_len[1]}], output " \
               f"U[{output_len[0]}, {output_len[1]}], ignore_eos"
    elif name == "fixed":
        prompt_lens = np.full(num_requests, input_len[0])
        output_lens = np.full(num_requests, output_len[0])
        desc = f"{num_requests} requests, {input_len[0]} in, {output_len[0]} out, ignore_eos"
    else:
        d = DISTRIBUTIONS[name]
        scale = max_model_len / PAPER_MAX_LEN

        def draw(mean: float, sigma: float) -> np.ndarray:
            mu = math.log(mean * scale) - sigma ** 2 / 2  # a log-normal's mean is exp(mu + sigma^2 / 2)
            return np.maximum(1, np.rint(rng.lognormal(mu, sigma, num_requests))).astype(np.int64)

        prompt_lens = draw(d["prompt_mean"], d["prompt_sigma"])
        output_lens = draw(d["output_mean"], d["output_sigma"])
        desc = (f"{num_requests} {name}-like requests, log-normal lengths with the paper's means "
                f"{d['prompt_mean']:.0f} in / {d['output_mean']:.0f} out scaled by {max_model_len}/"
                f"{PAPER_MAX_LEN}, ignore_eos")
    prompt_lens = np.clip(prompt_lens, 1, max_model_len - 1)
    output_lens = np.clip(output_lens, 1, max_model_len - prompt_lens)
    prompts = [rng.integers(3, vocab_size, int(n)).tolist() for n in prompt_lens]
    return Workload(name, prompts, [int(n) for n in output_lens], desc)


def _text_workload(name: str, num_requests: int, max_model_len: int, output_len: int,
                   tokenizer) -> Workload:
    if tokenizer is None:
        raise ValueError(f"workload {name!r} is text: it needs the model's tokenizer (a model directory "
                         "with tokenizer files)")
    texts = TEXT_WORKLOADS[name]
    prompts = [list(tokenizer.encode(texts[i % len(texts)]))[:max_model_len - 1]
               for i in range(num_requests)]
    max_tokens = [max(1, min(output_len, max_model_len - len(p))) for p in prompts]
    desc = f"{num_requests} {name} prompts (of {len(texts)}), {output_len} out, ignore_eos"
    return Workload(name, prompts, max_tokens, desc)

"""``bench serve``'s requests: vLLM's ``random``, ``sharegpt`` and ``custom`` datasets, from local files only.

Owns turning a dataset into SampleRequests (prompt text or token ids, its length in the server's tokens,
the output length to ask for), as ``vllm bench serve`` samples them: seeded, ShareGPT conversations' first
human turn with the reply's length (pairs under 4 tokens or over the context skipped), a custom JSONL file's
``prompt`` fields. Nothing is downloaded: a dataset is a path on this machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATASETS = ("random", "sharegpt", "custom")
MIN_SEQ_LEN = 4  # vLLM's is_valid_sequence: shorter prompts or replies are skipped


@dataclass(frozen=True)
class SampleRequest:
    """One request: ``prompt`` (text, or token ids), ``prompt_len`` (tokens), ``expected_output_len``
    (the max_tokens sent)."""

    prompt: str | list[int]
    prompt_len: int
    expected_output_len: int


def random_requests(tokenizer, num: int, input_len: int, output_len: int, range_ratio: float,
                    prefix_len: int, vocab_size: int, max_model_len: int, seed: int,
                    as_text: bool = True) -> list[SampleRequest]:
    """vLLM's random dataset: lengths uniform in [len * (1 - range_ratio), len * (1 + range_ratio)],
    random token ids (a shared prefix of ``prefix_len`` first), each clipped so prompt + output fits
    ``max_model_len``. ``as_text``: decoded to text (for chat; lengths then as the tokenizer counts them);
    else sent as token ids, exactly the lengths drawn (the completions endpoint takes them)."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    lo = lambda n: max(1, int(n * (1 - range_ratio)))  # noqa: E731
    hi = lambda n: max(1, int(n * (1 + range_ratio)))  # noqa: E731
    prefix = rng.integers(3, vocab_size, prefix_len).tolist()
    out = []
    for _ in range(num):
        n_in = int(rng.integers(lo(input_len), hi(input_len) + 1))
        n_out = int(rng.integers(lo(output_len), hi(output_len) + 1))
        n_out = max(1, min(n_out, max_model_len - prefix_len - 2))
        n_in = max(1, min(n_in, max_model_len - prefix_len - n_out - 1))
        ids = prefix + rng.integers(3, vocab_size, n_in).tolist()
        if tokenizer is None or not as_text:
            out.append(SampleRequest(ids, len(ids), n_out))
            continue
        text = tokenizer.decode(ids)
        ids = tokenizer.encode(text, add_special_tokens=False)[:max_model_len - n_out - 1]
        text = tokenizer.decode(ids)
        out.append(SampleRequest(text, len(tokenizer.encode(text)), n_out))
    return out


def _load_records(path: str | Path) -> list:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--dataset-path {str(path)!r} is not a file (nothing is downloaded: give a local "
                         "JSON or JSONL file)")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON / JSONL: {e}") from None
    return data if isinstance(data, list) else [data]


def _pick(candidates: list[SampleRequest], num: int, seed: int, what: str) -> list[SampleRequest]:
    if not candidates:
        raise ValueError(f"{what} has no usable request")
    order = np.random.default_rng(seed).permutation(len(candidates))
    picked = [candidates[i] for i in order[:num]]
    while len(picked) < num:  # fewer than asked: sample again, as vLLM oversamples
        picked.append(candidates[order[len(picked) % len(order)]])
    return picked


def sharegpt_requests(path, tokenizer, num: int, max_model_len: int, seed: int,
                      output_len: int | None = None) -> list[SampleRequest]:
    """ShareGPT's format: a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
    "value": ...}, ...]}: the first turn is the prompt, the second's token count the output length (or
    ``output_len``). Pairs with fewer than 4 tokens either side, or not fitting max_model_len, are
    skipped."""
    candidates = []
    for record in _load_records(path):
        turns = record.get("conversations") or record.get("conversation") or []
        if len(turns) < 2:
            continue
        prompt, reply = turns[0].get("value", ""), turns[1].get("value", "")
        prompt_len = len(tokenizer.encode(prompt))
        n_out = output_len if output_len is not None else len(tokenizer.encode(reply))
        if prompt_len < MIN_SEQ_LEN or (output_len is None and n_out < MIN_SEQ_LEN):
            continue
        if prompt_len + n_out >= max_model_len:
            continue
        candidates.append(SampleRequest(prompt, prompt_len, n_out))
    return _pick(candidates, num, seed, f"ShareGPT file {path}")


def custom_requests(path, tokenizer, num: int, max_model_len: int, seed: int,
                    output_len: int) -> list[SampleRequest]:
    """vLLM's custom dataset: JSONL (or a JSON list) of {"prompt": ...}, each asking ``output_len``
    tokens (clipped to the context)."""
    candidates = []
    for record in _load_records(path):
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str) or not prompt:
            continue
        prompt_len = len(tokenizer.encode(prompt))
        n_out = min(output_len, max_model_len - prompt_len - 1)
        if n_out >= 1:
            candidates.append(SampleRequest(prompt, prompt_len, n_out))
    return _pick(candidates, num, seed, f"custom file {path}")


def from_workload(workload) -> list[SampleRequest]:
    """A bench workload (minirunner/tools/bench/workloads.py: token ids) as requests."""
    return [SampleRequest(p, len(p), n) for p, n in zip(workload.prompts, workload.max_tokens, strict=True)]

"""SamplingParams: how one request is decoded (mirrors vLLM's offline API), validated on construction.

Owns the range checks of every field (a bad value raises ValueError naming the field and the fix). Checks
that need the model (token ids in ``logit_bias`` inside the vocabulary) happen at admission, in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# vLLM's default ``max_logprobs`` (ModelConfig): top-k lists longer than this are refused.
MAX_LOGPROBS = 20
# OpenAI's and vLLM's range for a logit bias value.
MAX_LOGIT_BIAS = 100.0


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class SamplingParams:
    """temperature 0 = greedy. top_k -1 (or 0) = off; top_p 1.0 = off; min_p 0 = off. ``seed`` makes
    sampling reproducible and independent of the batch (noise is keyed by (seed, position)); with
    ``n > 1`` the i-th completion uses a seed derived from it. ``stop``: strings that end the output
    (kept in the text only with ``include_stop_str_in_output``). ``max_tokens`` None = up to
    max_model_len. ``logprobs`` / ``prompt_logprobs``: how many top alternatives to return per token
    (0 = the chosen token only; None = none), from the raw model logits as vLLM does by default.
    Penalties follow vLLM: presence / frequency over output tokens (OpenAI's rule), repetition over
    prompt and output (the CTRL rule, as transformers applies it)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1 (the number of completions), got {self.n!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or a positive integer, got "
                             f"{self.top_k!r}")
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2] (0 = off), got {value!r}")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off, > 1 discourages repeats), "
                             f"got {self.repetition_penalty!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1 (or None), got "
                             f"{self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens "
                             f"({self.max_tokens}): lower min_tokens or raise max_tokens")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be None or an integer in [0, {MAX_LOGPROBS}] (how many "
                                 f"top alternatives per token), got {value!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a dict {token_id: bias}")
            bias = {}
            for token, value in self.logit_bias.items():
                token = int(token) if isinstance(token, str) and token.isdigit() else token
                if not _is_int(token) or token < 0:
                    raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got "
                                     f"{token!r}")
                if not _is_number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                    raise ValueError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, "
                                     f"{MAX_LOGIT_BIAS:g}], got {value!r} for token {token}")
                bias[token] = float(value)
            self.logit_bias = bias

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1.0)

"""SamplingParams: how one request is decoded (mirrors vLLM's offline API), validated on construction.

Owns the range checks of every field (a bad value raises ValueError naming the field and the fix), and
accepting every other field of vLLM's SamplingParams at its default value (a non-default value of a field
we do not implement raises ValueError naming it). Checks that need the model (token ids inside the
vocabulary, ``max_logprobs``, bad words' tokens) happen at admission (minirunner/engine/input_processor.py).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from minirunner.structured_output.params import StructuredOutputsParams

# vLLM's default ``max_logprobs`` (ModelConfig): top-k lists longer than this are refused at admission
# unless LLM(max_logprobs=...) raises it.
MAX_LOGPROBS = 20
# OpenAI's and vLLM's range for a logit bias value.
MAX_LOGIT_BIAS = 100.0


class RequestOutputKind(enum.Enum):
    """vLLM's choice of what a streamed RequestOutput carries. Here ``generate`` always returns final
    outputs and ``stream`` always yields deltas, whatever the request asks (as vLLM's offline
    ``LLM.generate`` returns final outputs)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


# vLLM fields we accept at their default value only: name -> (default, why another value is refused).
_DEFAULT_ONLY = {
    "best_of": (None, "removed in vLLM V1; use n"),
    "spaces_between_special_tokens": (True, "text is decoded with the tokenizer's own spacing"),
    "logits_processors": (None, "per-request Python callables cannot run inside a batched, "
                                "capturable sampling step; use logit_bias, allowed_token_ids or "
                                "bad_words"),
    "guided_decoding": (None, "removed in vLLM V1: use structured_outputs=StructuredOutputsParams(...)"),
    "stream_interval": (None, "stream() yields every step's new text"),
    "flat_logprobs": (False, "logprobs come as vLLM's list of {token_id: Logprob} dicts"),
    "logprob_token_ids": (None, "use logprobs=k for the top k"),
    "prompt_logprob_token_ids": (None, "use prompt_logprobs=k for the top k"),
    "prompt_logprob_start": (None, "prompt logprobs cover the whole prompt"),
    "skip_reading_prefix_cache": (None, "requests with prompt_logprobs skip the prefix cache already"),
    "thinking_token_budget": (None, "reasoning budgets are out of scope here"),
    "repetition_detection": (None, "use stop strings, stop_token_ids or max_tokens"),
    "routed_experts_prompt_start": (0, "no mixture-of-experts models are served here"),
    "trace_decode_token_ids": (None, "forced decoding is out of scope here"),
}


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
    prompt and output (the CTRL rule, as transformers applies it). ``seed=-1`` means unseeded, as
    vLLM (it becomes None). ``allowed_token_ids``: only these tokens may be sampled. ``bad_words``:
    a word (with and without a leading space, as vLLM tokenises it) may not be completed: its last
    token is banned whenever the output ends with the rest of it. ``truncate_prompt_tokens=k``: keep
    the prompt's last k tokens (-1: the last max_model_len - 1). ``structured_outputs``: a
    StructuredOutputsParams (a JSON schema, a regex, a choice, a grammar or any JSON object) the output
    must match. The other vLLM fields are accepted at their defaults (see ``_DEFAULT_ONLY``)."""

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
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    extra_args: dict[str, Any] | None = None  # accepted and unused, as by vLLM's own samplers
    skip_clone: bool = False  # no effect: the engine never changes a SamplingParams it was given
    # the output must match this grammar (minirunner/structured_output/; compiled at admission)
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM fields accepted at their default only (_DEFAULT_ONLY says why another value is refused).
    best_of: int | None = field(default=None, repr=False)
    spaces_between_special_tokens: bool = field(default=True, repr=False)
    logits_processors: list | None = field(default=None, repr=False)
    guided_decoding: Any = field(default=None, repr=False)
    stream_interval: int | None = field(default=None, repr=False)
    flat_logprobs: bool = field(default=False, repr=False)
    logprob_token_ids: list[int] | None = field(default=None, repr=False)
    prompt_logprob_token_ids: list[int] | None = field(default=None, repr=False)
    prompt_logprob_start: int | None = field(default=None, repr=False)
    skip_reading_prefix_cache: bool | None = field(default=None, repr=False)
    thinking_token_budget: int | None = field(default=None, repr=False)
    repetition_detection: Any = field(default=None, repr=False)
    routed_experts_prompt_start: int = field(default=0, repr=False)
    trace_decode_token_ids: list[int] | None = field(default=None, repr=False)
    # Set at admission (minirunner/engine/input_processor.py) on the engine's own copy: each bad word's token
    # ids, with and without a leading space.
    bad_words_token_ids: list[list[int]] | None = field(default=None, init=False, repr=False,
                                                         compare=False)

    def __post_init__(self) -> None:
        for name, (default, why) in _DEFAULT_ONLY.items():
            value = getattr(self, name)
            if value != default and not (default is None and value in ([], {}, ())):
                raise ValueError(f"{name}={value!r} is not supported here ({why}); leave it at "
                                 f"{default!r}")
        if self.seed == -1:
            self.seed = None  # vLLM's convention: -1 asks for unseeded sampling
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        # Each message contains vLLM's own (vllm/sampling_params.py), so code matching on it still works.
        if not _is_int(self.n):
            raise ValueError(f"n must be an int, but is of type {type(self.n)} (the number of completions)")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n} (the number of completions)")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):  # NaN slips through a range check; inf through a bound
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature} (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r} (1 = off)")
        if not _is_int(self.top_k):
            raise ValueError(f"top_k must be an integer, got {type(self.top_k).__name__} {self.top_k!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k} (-1 also "
                             "disables it)")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r} (0 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r} (0 = off)")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty!r} "
                             "(1 = off, > 1 discourages repeats)")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens!r} (an integer, or "
                             "None: up to max_model_len)")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens!r} "
                             "(an integer: the tokens generated before EOS or a stop token may end it)")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}: lower min_tokens or raise max_tokens")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop cannot contain an empty string: give non-empty stop strings")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must contain only integers, got {self.stop_token_ids!r} "
                             "(token ids >= 0)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"{name} must be non-negative or -1, got {value!r}; here None or an "
                                 "integer >= 0 (how many top alternatives per token): -1, the whole "
                                 "vocabulary, is not supported")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a dict {token_id: bias}")
            bias = {}
            for token, value in self.logit_bias.items():
                token = int(token) if isinstance(token, str) and token.isdigit() else token
                if not _is_int(token) or token < 0:
                    raise ValueError(f"logit_bias contains key(s) that cannot be converted to integer "
                                     f"token IDs: {token!r}; logit_bias keys must be token ids >= 0")
                if not _is_number(value) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                    raise ValueError(f"logit_bias values must be finite numbers in [-{MAX_LOGIT_BIAS:g}, "
                                     f"{MAX_LOGIT_BIAS:g}], got {value!r} for token {token}")
                bias[token] = float(value)
            self.logit_bias = bias
        self._check_vllm_extras()

    def _check_vllm_extras(self) -> None:
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids is not None and empty! Give at least one token id, "
                                 "or None to allow every token")
            if any(not _is_int(t) or t < 0 for t in self.allowed_token_ids):
                raise ValueError(f"allowed_token_ids must be token ids (integers >= 0), got "
                                 f"{self.allowed_token_ids!r}")
        if isinstance(self.bad_words, str):
            raise ValueError("bad_words must be a list of strings, e.g. bad_words=['word']")
        self.bad_words = list(dict.fromkeys(self.bad_words or []))
        if any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise ValueError(f"bad_words cannot contain an empty string: give non-empty strings, got "
                             f"bad_words={self.bad_words!r}")
        t = self.truncate_prompt_tokens
        if t is not None and (not _is_int(t) or (t < 1 and t != -1)):
            raise ValueError(f"truncate_prompt_tokens must be an integer >= 1 or -1, got {t!r} (-1 keeps "
                             "the last max_model_len - 1 tokens; None keeps the whole prompt)")
        if not isinstance(self.detokenize, bool):
            raise ValueError(f"detokenize must be True or False, got {self.detokenize!r}")
        if not self.detokenize and self.stop:
            raise ValueError("stop strings are only supported when detokenize is True. Set "
                             "detokenize=True to use stop (they are matched in the text), or use "
                             "stop_token_ids")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                  StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, e.g. "
                             f"StructuredOutputsParams(json=schema), got a "
                             f"{type(self.structured_outputs).__name__}")
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args must be a dict or None, got {self.extra_args!r}")

    def stops_on(self, token: int, num_outputs: int, eos_token_ids: frozenset[int]) -> bool:
        """Does ``token``, a request's ``num_outputs``-th output token, end it: EOS or a stop token id,
        once min_tokens outputs are reached (vLLM's rule; stop strings are the detokenizer's)."""
        return num_outputs >= self.min_tokens and (token in eos_token_ids or token in self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1.0)

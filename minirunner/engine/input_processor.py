"""InputProcessor: what a user passed to ``generate`` / ``add_request`` -> validated prompt token ids.

Owns vLLM's prompt forms (a string, a list of token ids, a TextPrompt ``{"prompt": str}`` or a
TokensPrompt ``{"prompt_token_ids": [...]}``, and lists of these), tokenisation, and every check a
request must pass before any work starts: a non-empty prompt, token ids inside the vocabulary, room
under max_model_len, a KV reservation the pool can ever hold, and the SamplingParams checks that need
the model (max_logprobs, allowed_token_ids, bad words' tokens, a structured-output grammar). It raises
ValueError naming what is wrong and what to do; it never queues a request and never touches the KV cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from minirunner.limits import check_n, check_seed
from minirunner.sampling_params import SamplingParams

# TextPrompt / TokensPrompt keys we serve, and keys of vLLM's prompt dicts we refuse (with why).
_PROMPT_KEYS = ("prompt", "prompt_token_ids")
_REFUSED_KEYS = {
    "multi_modal_data": "multi-modal input: the models served here are text-only",
    "mm_processor_kwargs": "multi-modal input: the models served here are text-only",
    "multi_modal_uuids": "multi-modal input: the models served here are text-only",
    "prompt_embeds": "prompt embeddings: pass text or token ids",
    "cache_salt": "per-request prefix-cache salts",
    "encoder_prompt": "encoder-decoder models",
    "decoder_prompt": "encoder-decoder models",
}


@dataclass(frozen=True, slots=True)
class ProcessedPrompt:
    """A validated prompt: its token ids, its text (None when given as token ids only), and the
    SamplingParams the engine runs it with (the user's own object, or a copy carrying derived state)."""

    token_ids: list[int]
    text: str | None
    params: SamplingParams


def _is_token_ids(value) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


# vLLM's messages for token ids outside the vocabulary (vllm/v1/engine/input_processor.py)
_OUT_OF_VOCAB = {
    "allowed_token_ids": lambda bad: "allowed_token_ids contains out-of-vocab token id!",
    "logit_bias": lambda bad: f"token_id(s) {bad[:5]} in logit_bias contain out-of-vocab token ids.",
    "stop_token_ids": lambda bad: f"Token id {bad[0]} in stop_token_ids is out of vocabulary.",
}


def split_prompts(prompts) -> list:
    """The prompts of one ``generate`` call as a list (a single prompt becomes a list of one).
    Raises TypeError naming what was passed when it is none of vLLM's prompt forms."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if prompts and _is_token_ids(prompts):
            return [list(prompts)]
        for i, p in enumerate(prompts):
            if not isinstance(p, (str, dict, list, tuple)):
                raise TypeError(f"prompt {i} is a {type(p).__name__}; each prompt must be a string, a "
                                "list of token ids, or a dict {'prompt': str} / "
                                "{'prompt_token_ids': [int, ...]}")
        return list(prompts)
    raise TypeError(f"prompts is a {type(prompts).__name__}; pass a string, a list of token ids, a "
                    "dict {'prompt': str} / {'prompt_token_ids': [int, ...]}, or a list of these")


class InputProcessor:
    """Tokenises and validates one request at a time against one engine's model and KV pool."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, max_logprobs: int,
                 reservation_blocks, num_kv_blocks, paged: bool = True, compile_grammar=None):
        """reservation_blocks: max_len -> the blocks a request of that length may need at most;
        num_kv_blocks: () -> the blocks the pool hands out; paged: the KV layout is paged (n > 1
        completions share the prompt's blocks, which a contiguous reservation cannot); compile_grammar:
        StructuredOutputsParams -> None, raising ValueError for a constraint that does not compile."""
        self.tokenizer, self.paged = tokenizer, paged
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.reservation_blocks = reservation_blocks
        self.num_kv_blocks = num_kv_blocks
        self._bad_word_ids: dict[str, list[list[int]]] = {}
        self.compile_grammar = compile_grammar

    # -- prompts --------------------------------------------------------------------------------
    def parse(self, prompt) -> tuple[list[int], str | None]:
        """(token ids, text or None) of one prompt in any of vLLM's single-prompt forms."""
        if isinstance(prompt, dict):
            return self._parse_dict(prompt)
        if isinstance(prompt, str):
            return self.encode(prompt), prompt
        if isinstance(prompt, (list, tuple)):
            if not _is_token_ids(prompt):
                raise ValueError("a prompt given as a list must hold integer token ids")
            return list(prompt), None
        raise ValueError(f"a prompt must be a string, a list of token ids or a prompt dict, not a "
                         f"{type(prompt).__name__}")

    def _parse_dict(self, prompt: dict) -> tuple[list[int], str | None]:
        for key, value in prompt.items():
            if key in _REFUSED_KEYS and value is not None:
                raise ValueError(f"the prompt dict has {key!r}, which is not supported here "
                                 f"({_REFUSED_KEYS[key]})")
            if key not in _PROMPT_KEYS and key not in _REFUSED_KEYS:
                raise ValueError(f"the prompt dict has an unknown key {key!r}: use {{'prompt': str}} "
                                 "or {'prompt_token_ids': [int, ...]}")
        text = prompt.get("prompt")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"'prompt' must be a string, got a {type(text).__name__}")
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not _is_token_ids(ids):
                raise ValueError("'prompt_token_ids' must be a list of integer token ids")
            return list(ids), text  # vLLM's TokensPrompt may carry its text for display
        if text is None:
            raise ValueError("the prompt dict has neither 'prompt' nor 'prompt_token_ids'")
        return self.encode(text), text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model directory has no tokenizer files: pass prompts as lists of "
                             "token ids (or LLM(tokenizer=<directory>))")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: no tokenizer can take it
            raise ValueError(f"the prompt text holds {text[e.start:e.end]!r} at character {e.start}, "
                             "which is not valid Unicode text (a lone surrogate): fix the text's "
                             "decoding") from None
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    # -- validation -----------------------------------------------------------------------------
    def process(self, prompt, params: SamplingParams) -> ProcessedPrompt:
        """Parse and validate one request; raises ValueError (nothing is queued either way)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got a "
                             f"{type(params).__name__}")
        token_ids, text = self.parse(prompt)
        max_model_len = self.max_model_len
        if params.truncate_prompt_tokens is not None:
            keep = max_model_len - 1 if params.truncate_prompt_tokens == -1 \
                else params.truncate_prompt_tokens
            if len(token_ids) > keep:
                token_ids, text = token_ids[-keep:], None  # vLLM keeps the last tokens
        if not token_ids:
            raise ValueError("Prompt cannot be empty: give at least one token")  # vLLM's phrase first
        if len(token_ids) >= max_model_len:
            longer = f"The decoder prompt (length {len(token_ids)}) is longer than the maximum model " \
                f"length of {max_model_len}. " if len(token_ids) > max_model_len else ""
            raise ValueError(f"{longer}the prompt has {len(token_ids)} tokens but max_model_len is "
                             f"{max_model_len}, which leaves no room to generate: shorten the prompt, "
                             "raise max_model_len, or pass truncate_prompt_tokens")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"Token id {bad[0]} is out of vocabulary: token ids {bad[:5]} are outside "
                             f"the vocabulary [0, {self.vocab_size}): use ids of this model's tokenizer")
        params = self._check_params(params)
        max_len = max_model_len if params.max_tokens is None else min(
            max_model_len, len(token_ids) + params.max_tokens)
        need, have = self.reservation_blocks(max_len), self.num_kv_blocks()
        if need > have:
            raise ValueError(f"this request needs up to {need} KV blocks (prompt {len(token_ids)} + "
                             f"max_tokens {params.max_tokens}) but the pool has only {have}: lower "
                             "max_tokens or enlarge the KV budget")
        return ProcessedPrompt(token_ids, text, params)

    def _check_params(self, params: SamplingParams) -> SamplingParams:
        check_n(params.n)
        if params.seed is not None:
            check_seed("seed", params.seed)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                kind = "sample" if name == "logprobs" else "prompt"
                raise ValueError(f"Requested {kind} logprobs of {value}, which is greater than max allowed: "
                                 f"{self.max_logprobs} ({name}={value} is more than max_logprobs="
                                 f"{self.max_logprobs}): ask for fewer, or raise LLM(max_logprobs=...)")
        vocab = self.vocab_size
        for name, ids in (("allowed_token_ids", params.allowed_token_ids or ()),
                          ("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)):
            bad = sorted(t for t in ids if t >= vocab)
            if bad:
                raise ValueError(f"{_OUT_OF_VOCAB[name](bad)} ({name} names token ids {bad[:5]} outside "
                                 f"the vocabulary [0, {vocab}): use ids of this model's tokenizer)")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer but this model directory has none: use "
                             "stop_token_ids instead")
        if params.n > 1 and not self.paged:
            raise ValueError(f"n={params.n} completions share the prompt's KV blocks, which a contiguous "
                             "reservation cannot: use kv_layout='paged', or n=1")
        if params.structured_outputs is not None:
            if self.compile_grammar is None:
                raise ValueError("structured output is not available with this input processor")
            self.compile_grammar(params.structured_outputs)  # a bad schema / regex / grammar: ValueError
        if not params.bad_words:
            return params
        if self.tokenizer is None:
            raise ValueError("bad_words need a tokenizer but this model directory has none: ban "
                             "single tokens with logit_bias {id: -100} instead")
        # The engine's own copy carries the derived ids; the user's SamplingParams stays as given.
        params = dataclasses.replace(params)
        params.bad_words_token_ids = [ids for word in params.bad_words
                                      for ids in self.bad_word_token_ids(word)]
        return params

    def bad_word_token_ids(self, word: str) -> list[list[int]]:
        """vLLM's rule: the word's tokens as it would start the text, and with a leading space (as in
        the middle of a text) when that gives a different first token and as many tokens."""
        if word not in self._bad_word_ids:
            plain = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if not plain:
                raise ValueError(f"bad word {word!r} encodes to no tokens: remove it")
            found = [plain]
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                found.append(spaced)
            bad = [t for ids in found for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"bad word {word!r} encodes to token ids {bad} outside the "
                                 f"vocabulary [0, {self.vocab_size})")
            self._bad_word_ids[word] = found
        return self._bad_word_ids[word]


def validate_batch(process, prompts: list, params: Sequence[SamplingParams]) -> list[ProcessedPrompt]:
    """Process every prompt of a batch before any of them is queued, as vLLM's LLM.generate does:
    the first bad one raises ValueError naming its index (so nothing is lost: nothing started)."""
    processed = []
    for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
        try:
            processed.append(process(prompt, sp))
        except ValueError as e:
            raise ValueError(f"prompt {i} was refused, so no prompt was run: {e}") from e
    return processed

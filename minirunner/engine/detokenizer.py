"""Incremental detokenisation of one request's output, with stop strings and a streaming holdback.

Owns turning output token ids into text a few tokens at a time (an offset scheme: only a short window
of recent tokens is decoded per step, so the cost per token does not grow with the output), finding stop
strings, and deciding how much text is safe to stream. Text once streamed is never taken back: streamed
text never ends in an incomplete character or in a prefix of a stop string, so the concatenation of
every chunk's text equals the final output text. Never touches tokens' K/V or the scheduler.
"""

from __future__ import annotations

_REPLACEMENT = "\ufffd"  # what a decoder yields for an incomplete UTF-8 sequence
# Prompt tokens decoded as left context of the output (vLLM's INITIAL_INCOMING_OFFSET is 5).
PROMPT_CONTEXT_TOKENS = 5


def decoder_for(tokenizer):
    """``decode(ids, skip_special_tokens)`` giving ``tokenizer.decode``'s text. For a fast tokenizer whose
    decode is transformers' own and cleans up no spaces, that text is its Rust ``backend_tokenizer``'s
    ``decode``, called directly (transformers' wrapper costs more than the decoding of a few tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        from transformers import PreTrainedTokenizerFast

        mro = type(tokenizer).__mro__
        below = mro[:mro.index(PreTrainedTokenizerFast)] if PreTrainedTokenizerFast in mro else None
        if below is not None and not any("decode" in vars(c) or "_decode" in vars(c) for c in below):
            return backend.decode  # no subclass decodes its own way
    return lambda ids, skip_special_tokens: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Per-request text state.

    ``prefix_offset:read_offset`` are the tokens whose text was last emitted (kept as left context so
    that a decoder that strips a leading space or merges bytes sees the same window both times);
    tokens after ``read_offset`` are pending (their text was incomplete). ``token_ids`` starts with the
    prompt's last few tokens, as vLLM's detokenizer does: the output is decoded as a continuation of
    the prompt, so a SentencePiece decoder, which drops the leading space (▁) of the first token it
    decodes, keeps the space of the first output token (" glit", not "glit").
    """

    __slots__ = ("tokenizer", "decoder", "skip_special_tokens", "stop", "include_stop", "min_tokens",
                 "token_ids", "prefix_offset", "read_offset", "_text", "num_sent", "finished",
                 "num_context")

    def __init__(self, tokenizer, skip_special_tokens: bool = True, stop: list[str] = (),
                 include_stop_str_in_output: bool = False, min_tokens: int = 0,
                 prompt_token_ids: list[int] = ()):
        self.tokenizer = tokenizer
        self.decoder = decoder_for(tokenizer)
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop)
        self.include_stop = include_stop_str_in_output
        self.min_tokens = min_tokens
        self.token_ids: list[int] = list(
            prompt_token_ids[max(0, len(prompt_token_ids) - PROMPT_CONTEXT_TOKENS):])
        self.num_context = len(self.token_ids)  # prompt tokens in front of the output's
        self.prefix_offset = 0
        self.read_offset = self.num_context
        self._text = ""
        self.num_sent = 0  # characters of output_text already streamed
        self.finished = False

    def _decode(self, ids: list[int]) -> str:
        return self.decoder(ids, self.skip_special_tokens)

    @property
    def output_text(self) -> str:
        """The text so far (decoding any tokens appended since it was last read)."""
        if self.read_offset < len(self.token_ids) and not self.finished:
            self._advance()
        return self._text

    def _advance(self) -> str:
        """Decode the tokens appended since the last emitted text; returns the new characters."""
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""  # a special token skipped, or a character still incomplete: wait
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self._text += delta
        return delta

    def append(self, token_id: int) -> str | None:
        """Add one output token; returns the stop string it completed (the text is then cut there),
        or None. Without stop strings nothing needs the text yet: decoding waits until it is read
        (one decode for several tokens, the same text)."""
        self.token_ids.append(token_id)
        if not self.stop:
            return None
        delta = self._advance()
        if not delta:
            return None
        # As vLLM: a stop string must end in text that follows the first min_tokens tokens (it may
        # begin inside them: "cd" stops "abcdef" at "ab" with min_tokens=3, one letter per token).
        if len(self.token_ids) - self.num_context <= self.min_tokens:
            return None
        return self._find_stop(len(delta))

    def _find_stop(self, num_new_chars: int) -> str | None:
        """As vLLM: the stop strings are tried in the order given, and the first one that now occurs
        wins (even when a later one in the list occurs earlier in the text)."""
        text = self._text
        for stop in self.stop:
            # A new match must end inside the new characters: search from len(stop) - 1 characters
            # before the first of them (vLLM's StopChecker.check_stop_strings).
            start = max(0, len(text) - num_new_chars - len(stop) + 1)
            pos = text.find(stop, start)
            if pos >= 0:
                self._text = text[:pos + len(stop)] if self.include_stop else text[:pos]
                self.finished = True
                return stop
        return None

    def finish(self, stopped_by_string: bool = False) -> None:
        """The request ended: flush text held for an incomplete character (a stop string already cut
        the text, so nothing after it is added)."""
        if not stopped_by_string and self.read_offset < len(self.token_ids):
            prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
            new_text = self._decode(self.token_ids[self.prefix_offset:])
            self._text += new_text[len(prefix_text):]
            self.read_offset = len(self.token_ids)
        self.finished = True

    def _holdback(self) -> int:
        """Characters at the end of the text that may still become a stop string."""
        if self.finished or self.include_stop or not self.stop:
            return 0
        text = self._text
        longest = 0
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def take_delta(self) -> str:
        """The text not streamed yet that can never be taken back; marks it streamed."""
        end = len(self.output_text) - self._holdback()
        if end <= self.num_sent:
            return ""
        delta = self.output_text[self.num_sent:end]
        self.num_sent = end
        return delta

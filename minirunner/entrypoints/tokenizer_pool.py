"""TokenizerPool: the server's tokenizing, chat-template rendering and prompt validation, in worker threads.

Owns keeping text work off both the event loop and the engine thread (the engine thread only schedules,
runs and hands out token ids): each worker thread has its own InputProcessor with its own tokenizer copy
(one fast tokenizer must not serve two threads at once), and a text whose length alone proves it cannot
fit max_model_len is refused before any tokenizer sees it (a 1 MB prompt costs a length check, not a
second of tokenizing). Chat templates render here too, under a time limit.
"""

from __future__ import annotations

import asyncio
import queue
from concurrent.futures import ThreadPoolExecutor

from minirunner.engine.input_processor import InputProcessor, validate_batch
from minirunner.tokenizer import render_chat

# A token's text is at most its vocabulary entry's length; unicode normalisation may shrink text, so the
# bound on characters per token is doubled.
NORMALIZATION_MARGIN = 2
TEMPLATE_TIMEOUT_S = 5.0  # the most a chat template may take to render


class PromptTooLongError(ValueError):
    """A text whose length alone proves it cannot fit max_model_len tokens."""


class TokenizerPool:
    """``workers`` threads; each task borrows a tokenizer copy (made from ``processor`` when none is free,
    so there are never more copies than threads) and gives it back when done."""

    def __init__(self, processor: InputProcessor, workers: int = 2):
        self.processor = processor
        self.max_model_len = processor.max_model_len
        self._copies: queue.SimpleQueue[InputProcessor] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="minirunner-tokenizer")
        tok = processor.tokenizer
        longest = max((len(t) for t in tok.get_vocab()), default=1) if tok is not None else 1
        self.max_chars = self.max_model_len * max(longest, 1) * NORMALIZATION_MARGIN

    def _borrowed(self, fn, *args):
        """``fn(own, *args)`` with a tokenizer copy no other thread holds meanwhile."""
        try:
            own = self._copies.get_nowait()
        except queue.Empty:
            own = self.processor.with_own_tokenizer()
        try:
            return fn(own, *args)
        finally:
            self._copies.put(own)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._borrowed, fn, *args)

    def check_length(self, text: str, what: str = "the prompt") -> None:
        """ValueError when ``text`` has more characters than max_model_len tokens can hold."""
        if len(text) > self.max_chars:
            raise PromptTooLongError(
                f"{what} has {len(text)} characters, more than this model's maximum context length of "
                f"{self.max_model_len} tokens can hold (at most {self.max_chars} characters): shorten it")

    def _texts(self, prompt) -> list[str]:
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt, dict) and "prompt_token_ids" not in prompt and \
                isinstance(prompt.get("prompt"), str):
            return [prompt["prompt"]]
        return []

    def _process(self, own: InputProcessor, prompts: list, params: list):

        def process(prompt, sp):
            if sp.truncate_prompt_tokens is None:
                for text in self._texts(prompt):
                    self.check_length(text)
            return own.process(prompt, sp)
        return validate_batch(process, prompts, params)

    async def process(self, prompts: list, params: list) -> list:
        """Tokenise and validate prompts (engine/input_processor.py's rules): ProcessedPrompts in order,
        or ValueError naming the first refused one."""
        return await self._run(self._process, prompts, params)

    def _render(self, own: InputProcessor, messages, template, add_generation_prompt,
                kwargs) -> tuple[str, list[int]]:
        text = render_chat(own.tokenizer, messages, template, add_generation_prompt, **kwargs)
        self.check_length(text, "the rendered chat prompt")
        # the template writes the special tokens itself, so the text is tokenised without adding any
        return text, own.encode(text, add_special_tokens=False)

    async def render_chat(self, messages: list[dict], template: str | None, add_generation_prompt: bool,
                          kwargs: dict, timeout: float = TEMPLATE_TIMEOUT_S) -> tuple[str, list[int]]:
        """(text, token ids) of a conversation rendered by ``template`` (or the tokenizer's). TimeoutError
        after ``timeout`` s (the thread finishes the render on its own; Python cannot stop it)."""
        return await asyncio.wait_for(
            self._run(self._render, messages, template, add_generation_prompt, kwargs), timeout)

    def _encode(self, own: InputProcessor, text: str, add_special_tokens: bool) -> list[int]:
        self.check_length(text)
        return own.encode(text, add_special_tokens=add_special_tokens)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._run(self._encode, text, add_special_tokens)

    def _decode(self, own: InputProcessor, token_ids: list[int]) -> str:
        tok = own.tokenizer
        if tok is None:
            raise ValueError("this model directory has no tokenizer files: nothing can be detokenized")
        return tok.decode(token_ids)

    async def decode(self, token_ids: list[int]) -> str:
        return await self._run(self._decode, token_ids)

    def _token_strs(self, own: InputProcessor, token_ids: list[int]) -> list[str]:
        return list(own.tokenizer.convert_ids_to_tokens(token_ids))

    async def token_strs(self, token_ids: list[int]) -> list[str]:
        return await self._run(self._token_strs, token_ids)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

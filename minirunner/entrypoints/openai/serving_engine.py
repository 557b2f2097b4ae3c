"""What both OpenAI endpoints share: the model check, validating prompts against the context, running
several prompts of one request concurrently (their outputs in batches, for one write per batch), usage.

Owns turning a parsed request into engine requests; never formats an endpoint's own response.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from minirunner.entrypoints.async_llm import AsyncLLM, DeltaOutput
from minirunner.entrypoints.openai.protocol import APIError, SamplingFields
from minirunner.sampling_params import SamplingParams


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class OpenAIServing:
    """One endpoint's access to the engine, under one served model name."""

    prefix = "cmpl"

    def __init__(self, engine: AsyncLLM, model_name: str):
        self.engine, self.model_name = engine, model_name
        self.max_model_len = engine.engine.config.max_model_len
        self.defaults = engine.get_default_sampling_params()

    def check_model(self, request: SamplingFields) -> None:
        """404 for a model this server does not serve (vLLM's NotFoundError); logs ignored fields."""
        if request.model is not None and request.model != self.model_name:
            raise APIError(f"The model `{request.model}` does not exist: this server serves "
                           f"`{self.model_name}` (GET /v1/models)", status=404, param="model",
                           type_="NotFoundError")
        request.warn_ignored()

    def new_id(self, base: str | None = None) -> str:
        """The response id: ``<prefix>-<base>`` (the X-Request-Id header or the request_id field, as
        vLLM), else a random one. Engine request ids stay unique either way (``engine_id``)."""
        return f"{self.prefix}-{base or uuid.uuid4().hex}"

    @staticmethod
    def engine_id(response_id: str) -> str:
        return f"{response_id}-{uuid.uuid4().hex[:8]}"

    @staticmethod
    def created() -> int:
        return int(time.time())

    async def prepare(self, prompts: list, params: SamplingParams) -> list:
        """Validate every prompt in the tokenizer pool; a prompt that with max_tokens would pass the
        context is refused (vLLM's rule), as is any the engine refuses: APIError, nothing queued."""
        try:
            processed = await self.engine.process_inputs(prompts, [params] * len(prompts))
        except ValueError as e:
            raise APIError(str(e), param="prompt") from None
        for i, p in enumerate(processed):
            n = len(p.token_ids)
            if params.max_tokens is not None and n + params.max_tokens > self.max_model_len:
                which = f"prompt {i} has" if len(processed) > 1 else "the prompt has"
                raise APIError(f"This model's maximum context length is {self.max_model_len} tokens. "
                               f"However, you requested {n + params.max_tokens} tokens ({which} {n}, "
                               f"max_tokens is {params.max_tokens}). Please reduce the length of the "
                               "prompt or max_tokens.", param="max_tokens")
        return processed

    async def run(self, processed: list, request_id: str) -> AsyncIterator[tuple[int, DeltaOutput]]:
        """(prompt index, delta) for every prompt, as the engine produces them. Leaving early (or being
        cancelled) aborts every prompt's request."""
        async for batch in self.run_batches(processed, request_id):
            for pair in batch:
                yield pair

    async def run_batches(self, processed: list,
                          request_id: str) -> AsyncIterator[list[tuple[int, DeltaOutput]]]:
        """As ``run``, but everything produced since the caller last resumed, at once (deltas of one
        completion merged): a streaming endpoint writes it in one piece. A prompt's finishing delta
        comes after its other deltas."""
        if len(processed) == 1:
            async for deltas in self.engine.generate_batches(processed[0], processed[0].params, request_id):
                yield [(0, d) for d in deltas]
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, prompt) -> None:
            try:
                async for deltas in self.engine.generate_batches(prompt, prompt.params, f"{request_id}-{i}"):
                    merged.put_nowait((i, deltas))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                merged.put_nowait((i, e))
                if isinstance(e, asyncio.CancelledError):
                    raise

        tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(processed)]
        left = len(tasks)
        try:
            while left:
                items = [await merged.get()]
                while not merged.empty():
                    items.append(merged.get_nowait())
                batch = []
                for i, deltas in items:
                    if isinstance(deltas, BaseException):
                        raise deltas
                    left -= deltas[-1].output is not None
                    batch.extend((i, d) for d in deltas)
                yield batch
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

"""POST /v1/completions: OpenAI's legacy completions, whole or streamed as Server-Sent Events.

Owns the completion response and chunk shapes (choices indexed prompt * n + completion, OpenAI's logprobs
object, usage); the engine work is serving_engine.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from minirunner.entrypoints.openai.protocol import APIError, CompletionRequest
from minirunner.entrypoints.openai.serving_engine import OpenAIServing, usage
from minirunner.entrypoints.openai.sse import ChunkHead, sse

FLOOR = -9999.0  # vLLM's floor for a log-probability in JSON (-inf is not JSON)


def completion_logprobs(token_ids: list[int], logprobs: list, k: int, offset: int = 0,
                        first_text: str | None = None) -> dict:
    """OpenAI's completion logprobs: each token's text and log-probability, its top-k alternatives
    (text -> log-probability, the sampled token included) and its text offset. A None entry (the
    prompt's first token, which nothing predicts) has text ``first_text`` and null logprobs, as vLLM."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for tid, d in zip(token_ids, logprobs, strict=False):
        if d is None:
            text = first_text or ""
            tokens.append(text)
            token_logprobs.append(None)
            top.append(None)
        else:
            chosen = d[tid]
            text = chosen.decoded_token or ""
            tokens.append(text)
            token_logprobs.append(max(chosen.logprob, FLOOR))
            alts = sorted((lp for t, lp in d.items() if lp.rank <= k or t == tid), key=lambda lp: lp.rank)
            top.append({(lp.decoded_token or ""): max(lp.logprob, FLOOR) for lp in alts})
        offsets.append(offset)
        offset += len(text)
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens,
            "top_logprobs": top}


def prompt_logprobs_json(prompt_logprobs: list | None) -> list | None:
    """vLLM's ``prompt_logprobs``: per prompt token None (the first) or {token id: {"logprob", "rank",
    "decoded_token"}}, -inf floored at -9999.0 as vLLM does for JSON."""
    if prompt_logprobs is None:
        return None
    return [None if d is None else {str(t): {"logprob": max(lp.logprob, FLOOR), "rank": lp.rank,
                                             "decoded_token": lp.decoded_token} for t, lp in d.items()}
            for d in prompt_logprobs]


class OpenAIServingCompletion(OpenAIServing):
    prefix = "cmpl"

    async def setup(self, request: CompletionRequest):
        """Check the request and validate its prompts; (prompts processed, params). Raises APIError."""
        self.check_model(request)
        prompts = request.prompts()
        params = request.completion_params(self.defaults)
        if not request.add_special_tokens:  # tokenised here, without the special tokens
            try:
                prompts = [{"prompt_token_ids": await self.engine.tokenizers.encode(p, False), "prompt": p}
                           if isinstance(p, str) else p for p in prompts]
            except ValueError as e:
                raise APIError(str(e), param="prompt") from None
        return await self.prepare(prompts, params), params

    async def create(self, request: CompletionRequest, processed: list, request_id: str) -> dict:
        n, outputs = request.n, {}
        async for i, delta in self.run(processed, self.engine_id(request_id)):
            if delta.output is not None:
                outputs[i] = delta.output
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for i in range(len(processed)):
            out = outputs[i]
            prompt_tokens += len(out.prompt_token_ids)
            echo = await self._echo_text(out) if request.echo else ""
            first = None
            if request.echo and request.logprobs is not None:
                first = await self.engine.tokenizers.decode(out.prompt_token_ids[:1])
            for c in out.outputs:
                token_ids, logprobs, text = list(c.token_ids), c.logprobs, c.text
                if request.echo_only:
                    token_ids, logprobs, text = [], [] if c.logprobs is not None else None, ""
                completion_tokens += len(token_ids)
                if request.echo and request.logprobs is not None:  # the prompt's logprobs, then these
                    token_ids = list(out.prompt_token_ids) + token_ids
                    logprobs = list(out.prompt_logprobs or []) + list(logprobs or [])
                lp = None
                if request.logprobs is not None and logprobs is not None:
                    lp = completion_logprobs(token_ids, logprobs, request.logprobs, first_text=first)
                choices.append({"index": i * n + c.index, "text": echo + text, "logprobs": lp,
                                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                                "prompt_logprobs": prompt_logprobs_json(out.prompt_logprobs)})
        return {"id": request_id, "object": "text_completion", "created": self.created(),
                "model": self.model_name, "choices": choices,
                "usage": usage(prompt_tokens, completion_tokens)}

    async def stream(self, request: CompletionRequest, processed: list,
                     request_id: str) -> AsyncIterator[str]:
        n, created = request.n, self.created()
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        continuous = bool(request.stream_options and request.stream_options.continuous_usage_stats)
        prompt_tokens = sum(len(p.token_ids) for p in processed)
        completion_tokens = 0
        offsets: dict[int, int] = {}
        head = {"id": request_id, "object": "text_completion", "created": created, "model": self.model_name}
        if request.echo:
            for i, p in enumerate(processed):
                text = p.text if p.text is not None else await self.engine.tokenizers.decode(p.token_ids)
                for j in range(n):
                    yield sse({**head, "choices": [{"index": i * n + j, "text": text, "logprobs": None,
                                                    "finish_reason": None}]})
        fast = ChunkHead(head, ', "usage": null' if include_usage else "")
        async for batch in self.run_batches(processed, self.engine_id(request_id)):
            events = []  # every chunk of one wake-up, written at once
            for i, delta in batch:
                index = i * n + delta.index
                if request.echo_only:  # the one token run for an echo is not returned
                    delta.text, delta.token_ids = "", []
                completion_tokens += len(delta.token_ids)
                if not (delta.text or delta.token_ids or delta.finished):
                    continue
                reason = delta.finish_reason if delta.finished else None
                stop = delta.stop_reason if delta.finished else None
                if delta.logprobs is None and not continuous:
                    events.append(fast.completion(index, delta.text, reason, stop))
                    continue
                lp = None
                if request.logprobs is not None and delta.logprobs is not None:
                    lp = completion_logprobs(delta.token_ids, delta.logprobs, request.logprobs,
                                             offsets.get(index, 0))
                    offsets[index] = offsets.get(index, 0) + sum(len(t) for t in lp["tokens"])
                chunk = {**head, "choices": [{"index": index, "text": delta.text, "logprobs": lp,
                                              "finish_reason": reason, "stop_reason": stop}]}
                if include_usage:
                    chunk["usage"] = usage(prompt_tokens, completion_tokens) if continuous else None
                events.append(sse(chunk))
            if events:
                yield "".join(events)
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(prompt_tokens, completion_tokens)})
        yield sse("[DONE]")

    async def _echo_text(self, out) -> str:
        if out.prompt is not None:
            return out.prompt
        return await self.engine.tokenizers.decode(out.prompt_token_ids)

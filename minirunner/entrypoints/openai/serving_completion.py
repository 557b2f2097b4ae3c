"""POST /v1/completions: OpenAI's legacy completions, whole or streamed as Server-Sent Events.

Owns the completion response and chunk shapes (choices indexed prompt * n + completion, OpenAI's logprobs
object, usage); the engine work is serving_engine.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from minirunner.entrypoints.openai.protocol import APIError, CompletionRequest
from minirunner.entrypoints.openai.serving_engine import OpenAIServing, usage
from minirunner.entrypoints.openai.sse import ChunkHead, sse


def completion_logprobs(token_ids: list[int], logprobs: list[dict], k: int, offset: int = 0) -> dict:
    """OpenAI's completion logprobs: each token's text and log-probability, its top-k alternatives
    (text -> log-probability, the sampled token included) and its text offset."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for tid, d in zip(token_ids, logprobs, strict=False):
        chosen = d[tid]
        text = chosen.decoded_token or ""
        tokens.append(text)
        token_logprobs.append(chosen.logprob)
        alts = sorted((lp for t, lp in d.items() if lp.rank <= k or t == tid), key=lambda lp: lp.rank)
        top.append({(lp.decoded_token or ""): lp.logprob for lp in alts})
        offsets.append(offset)
        offset += len(text)
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens,
            "top_logprobs": top}


class OpenAIServingCompletion(OpenAIServing):
    prefix = "cmpl"

    async def setup(self, request: CompletionRequest):
        """Check the request and validate its prompts; (prompts processed, params). Raises APIError."""
        self.check_model(request)
        prompts = request.prompts()
        if request.echo and request.logprobs is not None:
            raise APIError("echo with logprobs is not supported here (it needs the prompt's logprobs)",
                           param="echo")
        params = request.sampling_params(self.defaults, request.max_tokens, request.logprobs)
        return await self.prepare(prompts, params), params

    async def create(self, request: CompletionRequest, processed: list) -> dict:
        request_id, n = self.new_id(), request.n
        outputs = {}
        async for i, delta in self.run(processed, request_id):
            if delta.output is not None:
                outputs[i] = delta.output
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for i in range(len(processed)):
            out = outputs[i]
            prompt_tokens += len(out.prompt_token_ids)
            echo = self._echo_text(request, out) if request.echo else ""
            for c in out.outputs:
                completion_tokens += len(c.token_ids)
                lp = None
                if request.logprobs is not None and c.logprobs is not None:
                    lp = completion_logprobs(c.token_ids, c.logprobs, request.logprobs)
                choices.append({"index": i * n + c.index, "text": echo + c.text, "logprobs": lp,
                                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        return {"id": request_id, "object": "text_completion", "created": self.created(),
                "model": self.model_name, "choices": choices,
                "usage": usage(prompt_tokens, completion_tokens)}

    async def stream(self, request: CompletionRequest, processed: list) -> AsyncIterator[str]:
        request_id, n, created = self.new_id(), request.n, self.created()
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        continuous = bool(request.stream_options and request.stream_options.continuous_usage_stats)
        prompt_tokens = sum(len(p.token_ids) for p in processed)
        completion_tokens = 0
        offsets: dict[int, int] = {}
        head = {"id": request_id, "object": "text_completion", "created": created, "model": self.model_name}
        if request.echo:
            for i, p in enumerate(processed):
                text = p.text if p.text is not None else self.engine.get_tokenizer().decode(p.token_ids)
                for j in range(n):
                    yield sse({**head, "choices": [{"index": i * n + j, "text": text, "logprobs": None,
                                                    "finish_reason": None}]})
        fast = ChunkHead(head, ', "usage": null' if include_usage else "")
        async for batch in self.run_batches(processed, request_id):
            events = []  # every chunk of one wake-up, written at once
            for i, delta in batch:
                index = i * n + delta.index
                completion_tokens += len(delta.token_ids)
                if not (delta.text or delta.token_ids or delta.finished):
                    continue
                reason = delta.finish_reason if delta.finished else None
                if delta.logprobs is None and not continuous:
                    events.append(fast.completion(index, delta.text, reason))
                    continue
                lp = None
                if request.logprobs is not None and delta.logprobs is not None:
                    lp = completion_logprobs(delta.token_ids, delta.logprobs, request.logprobs,
                                             offsets.get(index, 0))
                    offsets[index] = offsets.get(index, 0) + sum(len(t) for t in lp["tokens"])
                chunk = {**head, "choices": [{"index": index, "text": delta.text, "logprobs": lp,
                                              "finish_reason": reason}]}
                if include_usage:
                    chunk["usage"] = usage(prompt_tokens, completion_tokens) if continuous else None
                events.append(sse(chunk))
            if events:
                yield "".join(events)
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(prompt_tokens, completion_tokens)})
        yield sse("[DONE]")

    def _echo_text(self, request: CompletionRequest, out) -> str:
        if out.prompt is not None:
            return out.prompt
        return self.engine.get_tokenizer().decode(out.prompt_token_ids)

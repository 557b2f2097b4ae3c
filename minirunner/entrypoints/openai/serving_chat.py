"""POST /v1/chat/completions: a conversation rendered by the tokenizer's chat template, whole or streamed.

Owns the chat response and chunk shapes (the assistant message, OpenAI's chat logprobs); a model whose
tokenizer has no chat template (and no --chat-template) gets a 400 naming the missing template.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from minirunner.entrypoints.openai.protocol import APIError, ChatCompletionRequest
from minirunner.entrypoints.openai.serving_engine import OpenAIServing, usage
from minirunner.entrypoints.openai.sse import ChunkHead, sse
from minirunner.tokenizer import render_chat


def _entry(lp) -> dict:
    text = lp.decoded_token or ""
    return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(token_ids: list[int], logprobs: list[dict], k: int) -> dict:
    """OpenAI's chat logprobs: per token its text, log-probability, bytes and top-k alternatives."""
    content = []
    for tid, d in zip(token_ids, logprobs, strict=False):
        top = sorted((lp for lp in d.values() if lp.rank <= k), key=lambda lp: lp.rank)[:k]
        content.append({**_entry(d[tid]), "top_logprobs": [_entry(lp) for lp in top]})
    return {"content": content}


class OpenAIServingChat(OpenAIServing):
    prefix = "chatcmpl"

    def __init__(self, engine, model_name: str, chat_template: str | None = None):
        super().__init__(engine, model_name)
        self.chat_template = chat_template

    async def setup(self, request: ChatCompletionRequest):
        """Check the request, render the conversation and validate it; (prompts, params)."""
        self.check_model(request)
        request.checked()
        tok = self.engine.get_tokenizer()
        template = request.chat_template or self.chat_template
        if tok is None or (template is None and not getattr(tok, "chat_template", None)):
            raise APIError("this model has no chat template (its tokenizer_config.json has no "
                           "'chat_template', and the server was started without --chat-template): use "
                           "/v1/completions, or start the server with --chat-template FILE",
                           param="messages")
        try:
            text = render_chat(tok, [m.as_dict() for m in request.messages], template,
                               request.add_generation_prompt, **(request.chat_template_kwargs or {}))
        except APIError:
            raise
        except Exception as e:  # a template that fails on these messages (jinja raises its own errors)
            raise APIError(f"the chat template could not render these messages: {e}",
                           param="messages") from None
        max_tokens = request.max_completion_tokens or request.max_tokens
        params = request.sampling_params(self.defaults, max_tokens, request.num_logprobs())
        # the template writes the special tokens itself, so the text is tokenised without adding any
        prompt = {"prompt_token_ids": tok.encode(text, add_special_tokens=False), "prompt": text}
        return await self.prepare([prompt], params), params

    async def create(self, request: ChatCompletionRequest, processed: list) -> dict:
        request_id = self.new_id()
        out = None
        async for _, delta in self.run(processed, request_id):
            out = delta.output or out
        k = request.num_logprobs()
        choices = []
        for c in out.outputs:
            lp = chat_logprobs(c.token_ids, c.logprobs, k) if k is not None and c.logprobs else None
            choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text},
                            "logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        return {"id": request_id, "object": "chat.completion", "created": self.created(),
                "model": self.model_name, "choices": choices,
                "usage": usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))}

    async def stream(self, request: ChatCompletionRequest, processed: list) -> AsyncIterator[str]:
        request_id, created = self.new_id(), self.created()
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        k = request.num_logprobs()
        head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                "model": self.model_name}
        for i in range(request.n):  # the assistant's role first, as OpenAI sends it
            yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]})
        prompt_tokens, completion_tokens = len(processed[0].token_ids), 0
        fast = ChunkHead(head, ', "usage": null' if include_usage else "")
        async for batch in self.run_batches(processed, request_id):
            events = []  # every chunk of one wake-up, written at once
            for _, delta in batch:
                completion_tokens += len(delta.token_ids)
                reason = delta.finish_reason if delta.finished else None
                if k is None or not delta.logprobs:
                    if delta.text or delta.finished:
                        events.append(fast.chat(delta.index, delta.text, reason))
                    continue
                lp = chat_logprobs(delta.token_ids, delta.logprobs, k)
                chunk = {**head, "choices": [{"index": delta.index,
                                              "delta": {"content": delta.text} if delta.text else {},
                                              "logprobs": lp, "finish_reason": reason}]}
                if include_usage:
                    chunk["usage"] = None
                events.append(sse(chunk))
            if events:
                yield "".join(events)
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(prompt_tokens, completion_tokens)})
        yield sse("[DONE]")

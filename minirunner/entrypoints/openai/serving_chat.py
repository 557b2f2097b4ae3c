"""POST /v1/chat/completions: a conversation rendered by the tokenizer's chat template, whole or streamed.

Owns the chat response and chunk shapes (the assistant message, OpenAI's chat logprobs); a model whose
tokenizer has no chat template (and no --chat-template) gets a 400 naming the missing template. A request's
own ``chat_template`` is refused unless the server trusts them (--trust-request-chat-template, as vLLM);
every template renders in the tokenizer pool under a time limit, never on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from minirunner.entrypoints.openai.protocol import APIError, ChatCompletionRequest
from minirunner.entrypoints.openai.serving_completion import prompt_logprobs_json
from minirunner.entrypoints.openai.serving_engine import OpenAIServing, usage
from minirunner.entrypoints.openai.sse import ChunkHead, sse
from minirunner.entrypoints.tokenizer_pool import PromptTooLongError


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

    def __init__(self, engine, model_name: str, chat_template: str | None = None,
                 trust_request_chat_template: bool = False):
        super().__init__(engine, model_name)
        self.chat_template = chat_template
        self.trust_request_chat_template = trust_request_chat_template

    async def render(self, request) -> tuple[str, list[int]]:
        """(text, token ids) of the request's conversation; APIError for a refused or failing template.
        Also /tokenize's, for a messages request."""
        if request.chat_template is not None and not self.trust_request_chat_template:
            raise APIError("chat_template in a request is refused: this server renders only its own "
                           "template (start it with --trust-request-chat-template to allow them)",
                           param="chat_template")
        tok = self.engine.get_tokenizer()
        template = request.chat_template or self.chat_template
        if tok is None or (template is None and not getattr(tok, "chat_template", None)):
            raise APIError("this model has no chat template (its tokenizer_config.json has no "
                           "'chat_template', and the server was started without --chat-template): use "
                           "/v1/completions, or start the server with --chat-template FILE",
                           param="messages")
        messages = [m.as_dict() for m in request.messages]
        try:
            return await self.engine.tokenizers.render_chat(
                messages, template, request.add_generation_prompt, request.chat_template_kwargs or {})
        except APIError:
            raise
        except PromptTooLongError as e:
            raise APIError(str(e), param="messages") from None
        except TimeoutError:
            raise APIError("the chat template took too long to render these messages",
                           param="messages") from None
        except Exception as e:  # a template that fails on these messages (jinja raises its own errors)
            raise APIError(f"the chat template could not render these messages: {e}",
                           param="messages") from None

    async def setup(self, request: ChatCompletionRequest):
        """Check the request, render the conversation and validate it; (prompts, params)."""
        self.check_model(request)
        request.checked()
        max_tokens = request.max_completion_tokens or request.max_tokens
        params = request.sampling_params(self.defaults, max_tokens, request.num_logprobs())
        text, token_ids = await self.render(request)
        return await self.prepare([{"prompt_token_ids": token_ids, "prompt": text}], params), params

    async def create(self, request: ChatCompletionRequest, processed: list, request_id: str) -> dict:
        out = None
        async for _, delta in self.run(processed, self.engine_id(request_id)):
            out = delta.output or out
        k = request.num_logprobs()
        choices = []
        for c in out.outputs:
            lp = chat_logprobs(c.token_ids, c.logprobs, k) if k is not None and c.logprobs else None
            choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text},
                            "logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        return {"id": request_id, "object": "chat.completion", "created": self.created(),
                "model": self.model_name, "choices": choices,
                "usage": usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs)),
                "prompt_logprobs": prompt_logprobs_json(out.prompt_logprobs)}

    async def stream(self, request: ChatCompletionRequest, processed: list,
                     request_id: str) -> AsyncIterator[str]:
        created = self.created()
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        continuous = include_usage and bool(request.stream_options.continuous_usage_stats)
        k = request.num_logprobs()
        head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                "model": self.model_name}
        for i in range(request.n):  # the assistant's role first, as OpenAI sends it
            yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]})
        prompt_tokens, completion_tokens = len(processed[0].token_ids), 0
        fast = ChunkHead(head, ', "usage": null' if include_usage else "")
        async for batch in self.run_batches(processed, self.engine_id(request_id)):
            events = []  # every chunk of one wake-up, written at once
            for _, delta in batch:
                completion_tokens += len(delta.token_ids)
                reason = delta.finish_reason if delta.finished else None
                stop = delta.stop_reason if delta.finished else None
                if (k is None or not delta.logprobs) and not continuous:
                    if delta.text or delta.finished:
                        events.append(fast.chat(delta.index, delta.text, reason, stop))
                    continue
                if not (delta.text or delta.finished or delta.logprobs):
                    continue
                lp = chat_logprobs(delta.token_ids, delta.logprobs, k) if k is not None and \
                    delta.logprobs else None
                chunk = {**head, "choices": [{"index": delta.index,
                                              "delta": {"content": delta.text} if delta.text else {},
                                              "logprobs": lp, "finish_reason": reason,
                                              "stop_reason": stop}]}
                if include_usage:
                    chunk["usage"] = usage(prompt_tokens, completion_tokens) if continuous else None
                events.append(sse(chunk))
            if events:
                yield "".join(events)
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(prompt_tokens, completion_tokens)})
        yield sse("[DONE]")

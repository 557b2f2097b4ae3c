"""POST /tokenize, POST /detokenize and GET /version, in vLLM's shapes.

Owns the token-counting routes clients (and ``vllm bench serve``'s prompt alignment) call: /tokenize
answers ``{"count", "max_model_len", "tokens", "token_strs"}`` for a prompt or a conversation (rendered as
chat requests are), /detokenize ``{"prompt"}``; all text work runs in the tokenizer pool.
"""

from __future__ import annotations

from minirunner import __version__
from minirunner.entrypoints.openai.protocol import APIError, DetokenizeRequest, TokenizeRequest
from minirunner.entrypoints.openai.serving_chat import OpenAIServingChat


class OpenAIServingTokenization:
    def __init__(self, chat: OpenAIServingChat):
        self.chat, self.engine = chat, chat.engine
        self.max_model_len = chat.max_model_len

    async def tokenize(self, request: TokenizeRequest) -> dict:
        self.chat.check_model(request)
        request.checked()
        pool = self.engine.tokenizers
        if self.engine.get_tokenizer() is None:
            raise APIError("this model directory has no tokenizer files: nothing can be tokenized")
        if request.messages is not None:
            _, tokens = await self.chat.render(request)
        else:
            add = True if request.add_special_tokens is None else request.add_special_tokens
            try:
                tokens = await pool.encode(request.prompt, add)
            except ValueError as e:
                raise APIError(str(e), param="prompt") from None
        strs = await pool.token_strs(tokens) if request.return_token_strs else None
        return {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens,
                "token_strs": strs}

    async def detokenize(self, request: DetokenizeRequest) -> dict:
        self.chat.check_model(request)
        vocab = self.engine.engine.model_config.vocab_size
        bad = [t for t in request.tokens if t >= vocab]
        if bad:
            raise APIError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="tokens")
        try:
            return {"prompt": await self.engine.tokenizers.decode(request.tokens)}
        except ValueError as e:
            raise APIError(str(e), param="tokens") from None

    @staticmethod
    def version() -> dict:
        return {"version": __version__}

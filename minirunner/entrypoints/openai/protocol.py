"""The OpenAI request schema (completions, chat completions) as pydantic models, and SamplingParams from it.

Owns which fields a request may carry (OpenAI's, plus the SamplingParams fields vLLM accepts as extra body
parameters), their types (strict: no NaN or infinity, no bool for a number) and OpenAI's error JSON.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from minirunner.sampling_params import SamplingParams

# OpenAI's limits: at most 128 completions per prompt; vLLM allows logprobs up to the engine's max_logprobs.
MAX_N = 128
# Integers the engine keeps in int64 (seed) or int32 (top_k, min_tokens) arrays: bounded here, so a huge
# value is a 400 naming it rather than an overflow inside a step that other requests share.
INT64 = 2**63
INT32 = 2**31


class APIError(Exception):
    """An error answered as OpenAI's JSON, ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 type_: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.status, self.param, self.type = message, status, param, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class StreamOptions(OpenAIModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingFields(OpenAIModel):
    """Fields both endpoints share: OpenAI's, then vLLM's extra sampling parameters. None: the model's
    generation_config.json default where it has one (vLLM's rule), else OpenAI's default."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted for the caller's bookkeeping; not used
    # vLLM's extra sampling parameters
    top_k: int | None = Field(None, ge=-1, lt=INT32)
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, ge=0, lt=INT32)
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=INT64)]] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    allowed_token_ids: list[Annotated[int, Field(ge=0, lt=INT64)]] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1, lt=INT32)
    prompt_logprobs: int | None = Field(None, ge=0)
    use_beam_search: bool = False
    best_of: int | None = None
    # structured output (entrypoints/openai/structured.py)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def sampling_params(self, defaults: SamplingParams, max_tokens: int | None,
                        logprobs: int | None) -> SamplingParams:
        """SamplingParams for this request; raises APIError for a value SamplingParams refuses."""
        if self.use_beam_search:
            raise APIError("use_beam_search=true is not supported here: beam search is out of scope",
                           param="use_beam_search")
        if self.best_of is not None and self.best_of != self.n:
            raise APIError("best_of is not supported here (removed in vLLM V1): use n", param="best_of")
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed when stream is true", param="stream_options")
        pick = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                              "presence_penalty", "frequency_penalty")}
        fields = {k: v if v is not None else getattr(defaults, k) for k, v in pick.items()}
        bias = None
        if self.logit_bias:
            try:
                bias = {int(k): v for k, v in self.logit_bias.items()}
            except ValueError:
                raise APIError("logit_bias keys must be token ids (integers as strings)",
                               param="logit_bias") from None
        from minirunner.entrypoints.openai.structured import structured_outputs_from_request

        structured = structured_outputs_from_request(self)
        try:
            return SamplingParams(
                n=self.n, max_tokens=max_tokens, seed=self.seed, stop=self.stop,
                stop_token_ids=list(self.stop_token_ids or []), min_tokens=self.min_tokens,
                include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
                logprobs=logprobs, prompt_logprobs=self.prompt_logprobs, logit_bias=bias,
                skip_special_tokens=self.skip_special_tokens, allowed_token_ids=self.allowed_token_ids,
                bad_words=self.bad_words, truncate_prompt_tokens=self.truncate_prompt_tokens,
                structured_outputs=structured, **fields)
        except (ValueError, TypeError) as e:
            raise APIError(str(e)) from None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list:
        """The request's prompts, each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            p = [p]
        if not p:
            raise APIError("prompt is empty: give a string, a list of strings or token ids", param="prompt")
        if self.suffix:
            raise APIError("suffix is not supported here (no fill-in-the-middle)", param="suffix")
        return list(p)


class ChatMessage(OpenAIModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)
    role: str
    content: str | list[dict[str, Any]] | None = None

    def as_dict(self) -> dict:
        """The message for the chat template: a list of parts becomes its text parts joined."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError("only text message parts ({'type': 'text', 'text': ...}) are "
                                   "supported: the models served here are text-only", param="messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        return {**(self.model_extra or {}), "role": self.role, "content": content or ""}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    # vLLM's chat extras
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    tools: list | None = None
    tool_choice: Literal["none"] | None = None

    def checked(self) -> ChatCompletionRequest:
        if self.tools:
            raise APIError("tools are not supported here (no tool calling)", param="tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
        return self

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

"""What the engine hands back: RequestOutput / CompletionOutput (vLLM's shape) and per-request metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Seconds. time_to_first_token: arrival -> first output token; decode_time: first -> last token."""

    time_to_first_token: float | None
    decode_time: float | None
    e2e_latency: float | None
    num_preemptions: int = 0
    num_cached_prompt_tokens: int = 0
    spec_decode: dict | None = None  # SpecStats.as_dict() when the request speculated


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None  # set when the request was refused (finish_reason "error")


@dataclass
class StreamChunk:
    """One streaming increment: the tokens (and text) a request produced in one engine step."""

    request_id: str
    index: int  # position of the prompt in the submitted list
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    output: RequestOutput | None = field(default=None, repr=False)  # set once finished

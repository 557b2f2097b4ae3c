"""What the engine hands back: RequestOutput / CompletionOutput (vLLM's shape) and per-request metrics.

Owns the output dataclasses and building one RequestOutput from a request's n completions; never
changes a request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minirunner.engine.request import Request
    from minirunner.logprobs import Logprob

# vLLM's shapes: one {token id: Logprob} per token; prompt logprobs start with None (first token).
SampleLogprobs = list[dict[int, "Logprob"]]
PromptLogprobs = list[dict[int, "Logprob"] | None]


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
    """One of a request's n completions. stop_reason: the stop string or stop token id that ended
    it; None for EOS, length and abort (as vLLM). logprobs / cumulative_logprob: None unless the
    request asked for logprobs."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    stop_reason: str | int | None = None
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission


@dataclass
class StreamChunk:
    """One streaming increment: the tokens (and text) a request produced in one engine step."""

    request_id: str
    index: int  # position of the prompt in the submitted list
    new_token_ids: list[int]
    new_text: str
    finished: bool  # this completion is done
    finish_reason: str | None = None
    output: RequestOutput | None = field(default=None, repr=False)  # set once all n are finished
    output_index: int = 0  # which of the prompt's n completions (CompletionOutput.index)


def build_request_output(group: list[Request]) -> RequestOutput:
    """A RequestOutput from a request's completions (group[0] computed the prompt)."""
    first = group[0]
    completions = []
    for r in group:
        text = r.detok.output_text if r.detok is not None else ""
        r.output_text = text
        completions.append(CompletionOutput(r.index, text, list(r.output_token_ids), r.finish_reason,
                                            r.stop_reason, r.logprobs, r.cumulative_logprob))
    return RequestOutput(
        request_id=first.group_id or first.request_id,
        prompt=first.prompt,
        prompt_token_ids=list(first.prompt_token_ids),
        outputs=completions,
        finished=all(r.is_finished for r in group),
        metrics=group_metrics(group, [r.finish_time for r in group]),
        prompt_logprobs=first.prompt_logprobs,
        num_cached_tokens=first.num_cached_tokens,
    )


def group_metrics(group: list[Request], finish_times: list[float | None]) -> RequestMetrics:
    """A request's RequestMetrics from its completions (group[0] computed the prompt) and the times each
    completion finished (None: not yet)."""
    first = group[0]
    ttft = decode = e2e = None
    if first.first_token_time is not None:
        ttft = first.first_token_time - first.arrival_time
    if None not in finish_times:
        e2e = max(finish_times) - first.arrival_time
        if first.first_token_time is not None:
            decode = max(finish_times) - first.first_token_time
    return RequestMetrics(ttft, decode, e2e, sum(r.num_preemptions for r in group), first.num_cached_tokens,
                          None if first.spec_stats is None else first.spec_stats.as_dict())

"""Request: one prompt's state as it moves through the engine (tokens, progress, blocks, timings).

Owns per-request bookkeeping only; the scheduler decides what happens to it and the KV manager owns
its blocks.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minirunner.engine.sequence import RunnableSequence
from minirunner.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again; its KV was dropped and will be recomputed
    FINISHED = "finished"


@dataclass(eq=False)  # requests are compared by identity, never field by field
class Request(RunnableSequence):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # the params' seed, or one drawn by the engine
    max_len: int  # prompt + max_tokens, capped at max_model_len
    eos_token_ids: frozenset[int] = frozenset()
    prompt: str | None = None
    priority: int = 0  # with LLM(scheduling_policy="priority"): lower is served first (request_queue.py)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, how many came from the prefix cache at admission
    num_output_placeholders: int = 0  # tokens a launched step may emit that the host has not read yet
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None
    output_text: str = ""
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    # vLLM-shaped extras: filled by the engine, read by build_request_output.
    group_id: str = ""  # the id add_request returned; its n completions share it
    index: int = 0  # which of the group's n completions this is
    detok: Any = None  # IncrementalDetokenizer, or None without a tokenizer
    fork_children: list = field(default_factory=list)  # completions 1..n-1, forked after the prompt
    logprobs: list | None = None  # per output token: {token id: Logprob}
    prompt_logprobs: list | None = None  # per prompt token: None for the first, then {id: Logprob}
    cumulative_logprob: float | None = None
    # speculative decoding
    spec_token_ids: list[int] = field(default_factory=list)  # drafts proposed for the next step
    spec_stats: object | None = None  # minirunner.spec_decode.metrics.SpecStats once it speculated
    # prompt + output token ids in one preallocated int64 array of max_len entries (valid up to
    # num_tokens): the runner slices it each step instead of concatenating lists. Output tokens are
    # added only through append_token, which keeps it and output_token_ids in step.
    token_buffer: np.ndarray = field(init=False, repr=False)


    def __post_init__(self) -> None:
        self.token_buffer = np.zeros(max(self.max_len, len(self.prompt_token_ids)), dtype=np.int64)
        self.token_buffer[:len(self.prompt_token_ids)] = self.prompt_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def decode_ready(self) -> bool:
        """Every token is on the host (none in flight) and all but the last are computed: the next step
        feeds that one token (and drafts after it)."""
        return self.num_output_placeholders == 0 and self.num_computed_tokens == self.num_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        self.token_buffer[self.num_tokens] = token_id
        self.output_token_ids.append(token_id)

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finish_time = time.perf_counter()

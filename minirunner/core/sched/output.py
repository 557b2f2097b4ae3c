"""SchedulerOutput: what one step sends across the worker boundary, as data (vLLM's
``core/sched/output.py``).

Owns the types only: new requests (prompt ids, sampling params, seed, block ids), running requests (new
block ids, computed counts), the step's per-request counts, drafts and in-flight flags, and what the
worker applies before the step: finished and preempted ids, block copies. It holds no
live ``Request`` or ``KVCacheManager``; the worker copies what it needs into its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minirunner.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """A request the worker has no row for: admitted, resumed after a preemption, or forked.

    ``prompt_token_ids`` and ``output_token_ids``: every token known now (a resumed request has
    outputs). ``num_computed_tokens``: tokens with K/V in the cache (prefix hits, a fork's prompt).
    ``prompt_logprobs_from``: the first prompt position whose logprob to score, or None."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: frozenset[int] = frozenset()
    prompt_logprobs_from: int | None = None
    max_len: int = 0  # prompt + max_tokens, capped at max_model_len: drafts never reach past it


@dataclass(slots=True)
class CachedRequestData:
    """Requests the worker has a row for, index by index. ``new_block_ids[i]``: ids to append to the
    row, or, where ``replace_block_ids[i]``, the whole table (it was replaced or edited)."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    replace_block_ids: list[bool] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """One step, as data. ``num_scheduled_tokens``: query tokens per request, in batch order.
    ``new_token_ids``: each request's known query tokens (int64, from position num_computed_tokens);
    ``scheduled_spec_decode_tokens``: the drafts that follow them; ``in_flight_req_ids``: requests
    whose last query token is still on the device (sampled by the step in flight);
    ``sampling_req_ids``: requests whose query reaches their last token, so the step samples for them;
    ``preempted_req_ids`` / ``finished_req_ids``: requests the worker forgets before the step (a
    preempted one keeps its logits-processor state; a finished or aborted one loses everything);
    ``block_copies``: (src, dst) KV blocks copied before the step writes (copy-on-write);
    ``num_spec_tokens``: how many drafts the worker proposes after sampling, for the next step (k);
    ``grammar_bitmask``: per structured-output request that samples, int32 [1 + drafts, ceil(vocab / 32)],
    bit t of row i set when token t is allowed at its i-th sampled position (structured_output/)."""

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    new_token_ids: dict[str, np.ndarray] = field(default_factory=dict)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    in_flight_req_ids: set[str] = field(default_factory=set)
    sampling_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: list[str] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    num_spec_tokens: int = 0
    grammar_bitmask: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    def num_computed_tokens(self) -> dict[str, int]:
        """Request id -> its computed tokens before this step (its first query position)."""
        starts = {new.req_id: new.num_computed_tokens for new in self.scheduled_new_reqs}
        cached = self.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        return starts

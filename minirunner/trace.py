"""StepTrace: what one engine step did (requests, tokens, blocks, preemptions, graphs, speculation), as
plain data for notebooks and plots. The engine fills one per step; ``LLM.get_step_trace`` hands them out
as dicts."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StepTrace:
    """What one engine step did, as plain data for notebooks and plots.

    Occupancy (``blocks_*``, ``kv_slots_*``, ``block_tables``) is taken during the step, after this step's
    K/V is in the cache and before finished requests free their blocks: the step's peak.
    ``blocks_used_after`` is what stays in use once they have. ``kv_slots_used`` counts tokens whose K/V
    the cache holds (a shared block counted once), ``kv_slots_allocated`` the slots of the blocks in use.
    ``block_tables`` is filled only with ``LLM(trace_block_tables=True)`` (copying every table each step
    costs time a benchmark should not pay). ``graph``, ``bucket_size`` and ``num_padded_rows`` say whether
    the step was one replay of a padded bucket (minirunner/graphs.py) or ran eager.
    """

    step: int
    request_ids: list[str]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_tokens: int
    num_output_tokens: int
    blocks_used: int
    blocks_free: int
    blocks_cached: int
    blocks_used_after: int
    kv_slots_used: int
    kv_slots_allocated: int
    num_running: int
    num_waiting: int
    num_preempted: int
    preempted_ids: list[str]
    finished_ids: list[str]
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    duration_s: float = 0.0
    graph: str = "eager"  # how the step ran: "eager", "compile" or "cuda" (one replay of a bucket)
    bucket_size: int | None = None  # the padded batch of a graph step
    num_padded_rows: int = 0  # bucket_size - requests in the step
    # speculative decoding: {request_id: [drafts verified, drafts accepted]}; rolled-back KV slots of a
    # request = drafts - accepted
    spec_runs: dict[str, list[int]] = field(default_factory=dict)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    propose_s: float = 0.0
    verify_s: float = 0.0
    # launched before the host read the previous step's tokens (async_scheduling: spec/async_loop.py)
    scheduled_ahead: bool = False

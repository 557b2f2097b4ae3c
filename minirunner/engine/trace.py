"""StepTrace: what one engine step did (requests, tokens, blocks, preemptions, graphs, speculation), as
plain data for notebooks and plots; StepTracer: the engine's recorder of them.

Owns the trace entries (the most recent ``TRACE_MAX_STEPS``) and the occupancy snapshot (blocks, KV
slots, block tables) taken at a step's peak. ``LLM.get_step_trace`` hands the entries out as dicts. It
reads the scheduler and the KV manager and never changes either.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TRACE_MAX_STEPS = 10_000


@dataclass(slots=True)
class StepTrace:
    """What one engine step did, as plain data for notebooks and plots.

    Occupancy (``blocks_*``, ``kv_slots_*``, ``block_tables``) is taken during the step, after this step's
    K/V is in the cache and before finished requests free their blocks: the step's peak.
    ``blocks_used_after`` is what stays in use once they have. ``kv_slots_used`` counts tokens whose K/V
    the cache holds (a shared block counted once), ``kv_slots_allocated`` the slots of the blocks in use.
    ``block_tables`` is filled only with ``LLM(trace_block_tables=True)`` (copying every table each step
    costs time a benchmark should not pay). ``graph``, ``bucket_size`` and ``num_padded_rows`` say whether
    the step was one replay of a padded bucket (minirunner/worker/cudagraph.py) or ran eager.
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
    graph: str = "eager"  # or "compile" / "cuda" (a bucket replayed), "piecewise" (the compiled forward)
    bucket_size: int | None = None  # the padded batch of a graph step
    num_padded_rows: int = 0  # bucket_size - requests in the step
    eager_reason: str = ""  # why no bucket took the step ("prefill", "no bucket", ...); "" for a replay
    # speculative decoding: {request_id: [drafts verified, drafts accepted]}; rolled-back KV slots of a
    # request = drafts - accepted
    spec_runs: dict[str, list[int]] = field(default_factory=dict)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    propose_s: float = 0.0
    verify_s: float = 0.0
    # launched before the host read the previous step's tokens (async_scheduling: engine/in_flight.py)
    scheduled_ahead: bool = False


class StepTracer:
    """Records one StepTrace per engine step (synchronous or launched ahead)."""

    def __init__(self, kv, scheduler, block_size: int, trace_block_tables: bool):
        self.kv, self.scheduler = kv, scheduler
        self.block_size, self.trace_block_tables = block_size, trace_block_tables
        # The most recent steps only, so a long-lived engine does not grow without bound.
        self.trace: deque[StepTrace] = deque(maxlen=TRACE_MAX_STEPS)
        self.num_steps = 0

    def occupancy(self) -> dict:
        """Blocks and KV slots in use now, and (with trace_block_tables) every block table."""
        pool, block_size, running = self.kv.pool, self.block_size, self.scheduler.running
        # A shared block holds its tokens once. Counting it as full is exact for prefix-cache hits (only
        # full blocks are shared) and over-subtracts a fork's partial prompt block until it is copied.
        held = sum(r.num_computed_tokens for r in running) - block_size * pool.num_shared_refs
        return dict(
            blocks_used=pool.num_used_blocks, blocks_free=pool.num_free_blocks,
            blocks_cached=pool.num_cached_free_blocks if self.kv.enable_prefix_caching else 0,
            kv_slots_used=held, kv_slots_allocated=pool.num_used_blocks * block_size,
            num_running=len(running),
            block_tables=({rid: list(t.blocks) for rid, t in self.kv.tables.items()}
                          if self.trace_block_tables else {}))

    def record(self, sched, *, finished: list[str], occupancy: dict, num_output_tokens: int,
               duration: float, graph, spec_runs: dict | None = None, propose_s: float = 0.0,
               verify_s: float = 0.0, scheduled_ahead: bool = False) -> StepTrace:
        """Append the entry of a step that ran ``sched`` (a ScheduledStep), how it ran (``graph``: a
        StepGraphInfo) and, for a speculative step, its runs."""
        prefill = sum(s.num_new_tokens for s in sched.scheduled if s.start < len(s.request.prompt_token_ids))
        spec_runs = spec_runs or {}
        entry = StepTrace(
            step=self.num_steps,
            request_ids=[s.request.request_id for s in sched.scheduled],
            num_prefill_tokens=prefill,
            num_decode_tokens=sched.num_tokens - prefill,
            num_tokens=sched.num_tokens,
            num_output_tokens=num_output_tokens,
            blocks_used_after=self.kv.pool.num_used_blocks,
            num_waiting=len(self.scheduler.waiting),
            num_preempted=len(sched.preempted),
            preempted_ids=list(sched.preempted),
            finished_ids=finished,
            duration_s=duration,
            graph=graph.graph,
            bucket_size=graph.bucket_size,
            num_padded_rows=graph.num_padded_rows,
            eager_reason=graph.reason,
            spec_runs=spec_runs,
            num_draft_tokens=sum(k for k, _ in spec_runs.values()),
            num_accepted_tokens=sum(a for _, a in spec_runs.values()),
            propose_s=propose_s if spec_runs else 0.0,
            verify_s=verify_s if spec_runs else 0.0,
            scheduled_ahead=scheduled_ahead,
            **occupancy,
        )
        self.trace.append(entry)
        self.num_steps += 1
        return entry

"""InFlightStep: a step the engine launched and has not read yet, and the rules for launching the next
step before reading it (async scheduling).

Owns that record and the rules only; the engine's loop (engine/engine.py) launches and reads the steps.
A request may be scheduled again while its previous step is in flight when the next step needs nothing
of that step the device does not hold: the one token it sampled (worker/async_output.py), or, after a
verify step, the drafts the worker proposed from its runs on the device (``may_verify_ahead``: a draft
model's steady batch). Not when the step verified drafts the worker did not propose on the device or
drafts for the next one from the tokens it reads, and not when completion 0 of an n > 1 group is about
to fork. A request whose logits processors must see the token first (bad words, a pending min_tokens)
sits the next step out (the scheduler's rule); the others go ahead.
"""

from __future__ import annotations

from dataclasses import dataclass

from minirunner.engine.scheduler import ScheduledStep
from minirunner.worker.async_output import AsyncOutput
from minirunner.worker.logits_processing import needs_logits_processing


@dataclass(eq=False)
class InFlightStep:
    """A launched step: what was scheduled (the requests' counts already moved on), its output once
    read, the host time it started and spent proposing and launching, and whether it was launched
    while another step was in flight (``ahead``)."""

    sched: ScheduledStep
    output: AsyncOutput
    t0: float
    propose_s: float
    verify_s: float
    ahead: bool = False


def may_continue(step: InFlightStep, drafting: bool) -> bool:
    """May the next step be launched before ``step`` is read? (See the module docstring.) ``drafting``:
    the speculator would propose drafts now — which it can only for requests whose tokens it has read."""
    for s in step.sched.scheduled:
        r = s.request
        if s.is_sampling and not r.is_finished and (drafting or s.draft_token_ids or r.fork_children):
            return False
    return True


def may_verify_ahead(step: InFlightStep, scheduler, kv, k: int, max_model_len: int) -> bool:
    """May a verify step of the drafts ``step``'s worker proposed on the device be launched before
    ``step`` is read? When the batch is steady: the same requests in the same order, each with one
    step in flight, k >= 1 the k those drafts have, no seat free for a waiting request, nothing that
    needs plain sampling or a fork, room for this step under max_len and for the drafts after it under
    ``max_model_len`` (the worker proposes them on the device), and blocks for every draft of it
    accepted (the worst case) without preempting anyone."""
    drafts, running = step.output.drafts, scheduler.running
    if drafts is None or k < 1 or k != drafts.k or [r.request_id for r in running] != drafts.req_ids:
        return False
    if scheduler.waiting and len(running) < scheduler.max_num_seqs \
            or len(running) * (k + 1) > scheduler.max_num_batched_tokens:
        return False
    blocks = 0
    for r in running:
        ahead = r.num_tokens + r.num_output_placeholders  # known tokens, and the worst case in flight
        if r.is_finished or r.num_computed_tokens != ahead - 1 or r.fork_children \
                or needs_logits_processing(r) or r.params.logprobs is not None \
                or r.params.prompt_logprobs is not None or ahead + k + 1 > r.max_len \
                or ahead + 2 * k + 1 > max_model_len:
            return False
        # the step's k + 1 tokens, and the lookahead the draft's passes after it write (k)
        need = min(r.num_computed_tokens + 2 * k + 1, max(r.max_len - 1, r.num_computed_tokens + k + 1))
        blocks += max(0, kv.blocks_for_tokens(need) - len(kv.table(r.request_id)))
    return blocks <= kv.pool.num_free_blocks

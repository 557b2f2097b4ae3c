"""InFlightStep: a step the engine launched and has not read yet, and the rule for launching the next
step before reading it (async scheduling).

Owns that record and the rule only; the engine's loop (engine/engine.py) launches and reads the steps.
A request may be scheduled again while its previous step is in flight when the next step needs nothing
of that step but the one token it samples, which the device feeds (worker/async_output.py): not when
the step verified drafts (how many were accepted is read on the host; a draft-model speculator's
steady batch continues on the device instead, spec_decode/draft_chain.py) or the step drafts for the
next one (the runner proposes from the tokens it read), not when completion 0 of an
n > 1 group is about to fork, and not when the host-side logits processors (penalties, min_tokens,
logit bias, bad words, min_p) must see the token first.
"""

from __future__ import annotations

from dataclasses import dataclass

from minirunner.engine.scheduler import ScheduledStep
from minirunner.worker.async_output import AsyncOutput
from minirunner.worker.logits_processing import needs_logits_processing


@dataclass(eq=False)
class InFlightStep:
    """A launched step: what was scheduled (the requests' counts already moved on), its output once
    read, the host time it started and spent proposing and launching, whether it was launched while
    another step was in flight (``ahead``), and whether a draft chain launched it (``chained``)."""

    sched: ScheduledStep
    output: AsyncOutput
    t0: float
    propose_s: float
    verify_s: float
    ahead: bool = False
    chained: bool = False


def may_continue(step: InFlightStep, drafting: bool) -> bool:
    """May the next step be launched before ``step`` is read? (See the module docstring.) ``drafting``:
    the speculator would propose drafts now — which it can only for requests whose tokens it has read."""
    for s in step.sched.scheduled:
        r = s.request
        if s.samples and not r.is_finished and (
                drafting or s.draft_token_ids or r.fork_children or needs_logits_processing(r)):
            return False
    return True

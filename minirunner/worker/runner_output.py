"""What one ModelRunner step hands back to the engine (vLLM's ``ModelRunnerOutput``), as a return value.

Owns the typed result of ``ModelRunner.execute``: the run of tokens each sampling request emits, the
step's raw logits, the sampled and prompt logprobs, and how the step ran (eager, or one replay of a
padded bucket). It is plain data: it never touches a request and is never kept by the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minirunner.logprobs import TokenLogprobs


@dataclass(slots=True)
class StepGraphInfo:
    """How a step ran: ``graph`` "eager", "compile" or "cuda" (one replay of a bucket), or "piecewise"
    (graph_mode="compile", a step no bucket took: the compiled forward, attention eager between its
    pieces); ``bucket_size`` the padded batch of a bucket step (None otherwise); ``num_padded_rows`` =
    bucket_size - requests; ``reason``: why a step no bucket took ran so ("prefill", "no bucket",
    "ragged drafts", "no graphs"), "" for a replay."""

    graph: str = "eager"
    bucket_size: int | None = None
    num_padded_rows: int = 0
    reason: str = ""


@dataclass(slots=True)
class RunnerOutput:
    """One step's results, in the order of the step's sampling requests (``req_ids``).

    runs: the tokens each emits (one, or the accepted run of a speculative request); logits: fp32
    [rows, vocab], raw (before penalties, bias and temperature), ``1 + drafts`` rows per request, or None
    when nothing sampled; logprobs: the sampled tokens' scores (None unless a request asked);
    prompt_logprobs: request id -> (first scored prompt position, scores); graph: how the step ran;
    device_s: seconds the step took on the device (None for a step that was not timed);
    draft_token_ids: request id -> the drafts proposed after sampling, for the next step (vLLM's
    ``DraftTokenIds``); propose_s: the host seconds proposing took.
    """

    req_ids: list[str] = field(default_factory=list)
    runs: list[list[int]] = field(default_factory=list)
    logits: torch.Tensor | None = None
    num_drafts: list[int] = field(default_factory=list)
    logprobs: TokenLogprobs | None = None
    prompt_logprobs: dict[str, tuple[int, TokenLogprobs]] = field(default_factory=dict)
    graph: StepGraphInfo = field(default_factory=StepGraphInfo)
    device_s: float | None = None  # the step's device time, set when its output is read
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    propose_s: float = 0.0

    def first_logits(self) -> dict[str, torch.Tensor]:
        """request id -> the logits row of the first token it sampled this step (tests and notebooks
        compare these with a reference model)."""
        if self.logits is None:
            return {}
        first = np.cumsum([0] + [1 + d for d in self.num_drafts])
        return {rid: self.logits[int(first[i])] for i, rid in enumerate(self.req_ids)}

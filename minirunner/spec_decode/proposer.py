"""Proposer: what the worker asks of a way of drafting tokens (a draft model, or n-gram lookup).

Owns the protocol and its input (``DraftInput``: one request's tokens and sampling parameters, as the
worker's state row holds them); each proposer declares the protocol explicitly. A host proposer (n-gram)
drafts from the tokens read; the draft model (``proposes_on_device``) runs its passes inside the
worker's step instead (worker/drafter.py) and is not asked to ``propose``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from minirunner.sampling_params import SamplingParams


@dataclass(slots=True, eq=False)
class DraftInput:
    """One request to draft for: ``all_token_ids`` its tokens, the one just sampled last; ``params``
    and ``seed`` its own (a draft model samples with them, salted)."""

    request_id: str
    all_token_ids: np.ndarray | list[int]
    params: SamplingParams
    seed: int


class Proposer(Protocol):
    def propose(self, requests: list[DraftInput], ks: list[int]
                ) -> dict[str, tuple[list[int], torch.Tensor | None]]:
        """Draft ks[i] tokens for requests[i]: {request_id: (tokens, q)}, q fp32 [len(tokens), vocab]
        the distribution each was drawn from, or None for one-hot drafts. A request may get fewer
        tokens, or none."""
        ...

    def free(self, request_id: str) -> None:
        """Free one finished or aborted request's state."""
        ...

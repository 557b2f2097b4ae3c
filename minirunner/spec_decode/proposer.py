"""Proposer: what the speculator asks of a way of drafting tokens (a draft model, or n-gram lookup).

Owns the protocol only; each proposer declares it explicitly.
"""

from __future__ import annotations

from typing import Protocol

import torch

from minirunner.engine.request import Request


class Proposer(Protocol):
    def propose(self, requests: list[Request], ks: list[int]
                ) -> dict[str, tuple[list[int], torch.Tensor | None]]:
        """Draft ks[i] tokens for requests[i] (each decode-ready): {request_id: (tokens, q)}, q fp32
        [len(tokens), vocab] the distribution each was drawn from, or None for one-hot drafts. A request
        may get fewer tokens, or none."""
        ...

    def release(self, live_ids: set[str]) -> None:
        """Free the state of every request not in ``live_ids``."""
        ...

    def free(self, request_id: str) -> None:
        """Free one finished or aborted request's state."""
        ...

"""Helpers of the draft chain (spec_decode/draft_chain.py): the device state of a chained step and the
no-sync check.

Owns nothing with state; it never launches or reads a step itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from minirunner.engine.request import Request


@dataclass(eq=False)
class ChainState:
    """What the next chained step is built from, on the device, before the host reads this one."""

    requests: list[Request]
    k: int
    start: torch.Tensor  # int64 [n]: position of each request's first verify token (its last known one)
    ids: torch.Tensor  # int64 [n, k + 1]: the verify step's tokens (last known token, then k drafts)
    runs: torch.Tensor  # int64 [n, k + 1]: emitted runs, -1 after each ends (own storage)


def sync_check(enabled: bool, device: torch.device):
    """With ``enabled`` on CUDA: any operation that waits for the device raises (torch's sync debug
    mode) while a step is prepared and launched ahead. Graph captures sync, so warm up first."""
    if not (enabled and device.type == "cuda"):
        return contextlib.nullcontext()
    return _sync_debug_error()


@contextlib.contextmanager
def _sync_debug_error():
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(old)

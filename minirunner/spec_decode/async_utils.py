"""Helpers of the draft chain (spec_decode/draft_chain.py): the device state of a chained step, host
arrays staged for non-blocking copies, and the no-sync check.

Owns nothing with state; it never launches or reads a step itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
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


def staged(device: torch.device, arr: np.ndarray) -> torch.Tensor:
    """A host array as a tensor a non-blocking copy may read: fresh pinned memory on CUDA (torch's
    pinned allocator reuses a block only once the copies reading it are done), the array itself on a
    CPU."""
    t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.pin_memory() if device.type == "cuda" else t


def device_ints(device: torch.device, values) -> torch.Tensor:
    """int64 values on the device, copied without blocking the host."""
    return staged(device, np.asarray(values, dtype=np.int64)).to(device, non_blocking=True)


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

"""Helpers of the step launched ahead (spec_decode/async_loop.py): the record of a launched step, host
arrays staged for non-blocking copies, the no-sync check, and merging two steps' tokens.

Owns nothing with state; it never launches or reads a step itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from minirunner.engine.request import Request


@dataclass(eq=False)
class LaunchedStep:
    """A step on the device whose runs the host has not read yet."""

    requests: list[Request]
    k: int
    bucket: int
    start: torch.Tensor  # int64 [n]: position of each request's first verify token (its last known one)
    ids: torch.Tensor  # int64 [n, k + 1]: the verify step's tokens (last known token, then k drafts)
    runs: torch.Tensor  # int64 [n, k + 1]: emitted runs, -1 after each ends (own storage)
    host: torch.Tensor | None  # pinned copy of runs (CUDA), valid once ``ready`` has passed
    ready: torch.cuda.Event | None
    propose_s: float
    verify_s: float
    t0: float


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


def merge_produced(first: list[tuple[Request, list[int]]], second: list[tuple[Request, list[int]]]):
    """Two steps' (request, tokens) lists as one: a request's tokens concatenated, first-seen order."""
    out: dict[int, tuple[Request, list[int]]] = {}
    for r, tokens in first + second:
        if id(r) in out:
            out[id(r)][1].extend(tokens)
        else:
            out[id(r)] = (r, list(tokens))
    return list(out.values())

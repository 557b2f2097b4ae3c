"""The no-sync check: with it on (CUDA), any operation that waits for the device raises while a step is
prepared and launched ahead of the step in flight (async scheduling's promise, checked by the engine's
``check_no_sync`` and the GPU tests).

Owns nothing with state; it never launches or reads a step itself.
"""

from __future__ import annotations

import contextlib

import torch


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

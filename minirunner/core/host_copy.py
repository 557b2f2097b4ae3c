"""Host arrays onto the device without blocking the host: a pinned copy on CUDA, the array itself on a CPU.

Owns the one rule every host-to-device copy on the step path follows (engine, worker, attention and
speculative decoding alike): a pageable ``.to(cuda)`` waits for the stream, so a step scheduled ahead
would wait for the step before it.
"""

from __future__ import annotations

import numpy as np
import torch


def pinned(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array as a tensor a non-blocking copy to ``device`` may read: fresh pinned memory on CUDA
    (torch's pinned allocator reuses a block only once the copies reading it are done, so a copy still
    in flight never sees it change), the array itself on a CPU."""
    t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.pin_memory() if device.type == "cuda" else t


def to_device(arr: np.ndarray, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A host array on ``device`` (as ``dtype`` when given, converted on the device), copied without
    blocking the host (:func:`pinned`); on a CPU the array itself, no copy unless ``dtype`` asks."""
    t = pinned(arr, device).to(device, non_blocking=True)
    return t if dtype is None else t.to(dtype)

"""Split-KV decode sizing: how many partial results a decode program writes per (sequence, KV head), and
the workspace :func:`minirunner.kernels.paged_attention.paged_decode` writes them into.

Owns the choice only; the attention itself is ``paged_attention``'s.
"""

from __future__ import annotations

import functools
import math

import torch

from minirunner.kernels._triton import next_pow2


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_num_splits(num_programs: int, max_kv_len: int, device: torch.device) -> int:
    """Split decode over a sequence's tiles only when (sequence, KV head) pairs cannot fill the GPU."""
    if device.type != "cuda":
        return 1
    sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    if num_programs >= sms:
        return 1
    by_occupancy = next_pow2(math.ceil(2 * sms / max(1, num_programs)))
    by_length = next_pow2(max(1, max_kv_len // 512))
    return max(1, min(by_occupancy, by_length, 16))


def decode_workspace(q: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, ...]:
    """The buffers :func:`paged_decode` writes for q [num_seqs, num_q_heads, head_dim]: (out like q,
    fp32 split-KV partials part_acc [num_seqs, num_q_heads, num_splits, head_dim], part_m and part_l
    [num_seqs, num_q_heads, num_splits]); with one split the partials are unused aliases of out."""
    out = torch.empty_like(q)
    if num_splits == 1:
        return out, out, out, out
    s, hq, d = q.shape
    part_acc = torch.empty(s, hq, num_splits, d, device=q.device, dtype=torch.float32)
    part_m = torch.empty(s, hq, num_splits, device=q.device, dtype=torch.float32)
    return out, part_acc, part_m, torch.empty_like(part_m)

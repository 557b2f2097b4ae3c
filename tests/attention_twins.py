"""The runner's attention twin (minirunner/kernels/paged_attention_ref.py), wrapped as notebook 08 wraps it:
the reference the notebook's checkers and its numpy mechanisms are compared against."""

from __future__ import annotations

import torch

from minirunner.kernels.paged_attention_ref import paged_decode_ref


def twin_head(q, k, v, scale):
    """paged_decode_ref on one sequence of one head: q [D], k and v [L, D] as one block."""
    cache = torch.stack((torch.as_tensor(k, dtype=torch.float32), torch.as_tensor(v, dtype=torch.float32)))
    cache = cache[None, :, :, None, :]  # [1 block, 2, L, 1 KV head, D]
    out = paged_decode_ref(torch.as_tensor(q, dtype=torch.float32)[None, None], cache,
                           torch.zeros(1, 1, dtype=torch.int32), torch.tensor([len(k)], dtype=torch.int32),
                           scale)
    return out[0, 0].double().numpy()


def twin_paged(q, cache, block_table, seq_len, scale):
    out = paged_decode_ref(torch.as_tensor(q, dtype=torch.float32)[None], torch.as_tensor(cache).float(),
                           torch.tensor([block_table], dtype=torch.int32),
                           torch.tensor([seq_len], dtype=torch.int32), scale)
    return out[0].double().numpy()

"""The Triton attention backend: ``kernels.paged_attention``'s kernels behind the backend interface.

Owns only the dispatch: store_kv first, then paged_decode for decode-only batches (one query token
per sequence) and paged_prefill for everything else. Runs compiled on CUDA and in the Triton
interpreter on CPU (TRITON_INTERPRET=1, slow: for tests).
"""

from __future__ import annotations

import os

import torch

from kernels.paged_attention import paged_decode, paged_prefill, store_kv
from minirunner.attention.base import AttentionBackend
from minirunner.attention.metadata import AttentionMetadata


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 block_size: int, device: torch.device, dtype: torch.dtype):
        super().__init__(num_q_heads, num_kv_heads, head_dim, scale, block_size, device, dtype)
        if torch.device(device).type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention_backend='triton' on CPU needs the Triton interpreter: set "
                             "TRITON_INTERPRET=1 before Python starts (slow; for tests), or use "
                             "attention_backend='torch'")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        store_kv(k, v, kv_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return paged_decode(q, kv_cache, meta.block_tables, meta.seq_lens, self.scale)
        return paged_prefill(q, kv_cache, meta.block_tables, meta.query_start_loc,
                             meta.seq_lens, self.scale)

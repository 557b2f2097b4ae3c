"""The Triton attention backend: the kernels of ``kernels.paged_attention`` behind the backend interface.

Owns only the dispatch: store_kv first, then paged_decode for decode-only batches (one query token
per sequence) and paged_prefill for everything else. Runs compiled on CUDA and in the Triton
interpreter on CPU (TRITON_INTERPRET=1, slow: for tests).
"""

from __future__ import annotations

import torch

from kernels.paged_attention import paged_decode, paged_prefill, store_kv
from minirunner.attention.base import AttentionBackend
from minirunner.attention.metadata import AttentionMetadata


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        store_kv(k, v, kv_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return paged_decode(q, kv_cache, meta.block_tables, meta.seq_lens, self.scale)
        return paged_prefill(q, kv_cache, meta.block_tables, meta.query_start_loc,
                             meta.seq_lens, self.scale)

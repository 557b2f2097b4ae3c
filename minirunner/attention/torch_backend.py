"""The torch reference attention backend: readable, runs anywhere, and is the correctness baseline.

Owns nothing but the dispatch to the torch twins in ``kernels.paged_attention``: decode-only batches
use the decode twin, anything else the prefill/extend twin.
"""

from __future__ import annotations

import torch

from kernels.paged_attention import paged_decode_ref, paged_prefill_ref, store_kv_ref
from minirunner.attention.base import AttentionBackend
from minirunner.attention.metadata import AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        store_kv_ref(k, v, kv_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return paged_decode_ref(q, kv_cache, meta.block_tables, meta.seq_lens, self.scale)
        return paged_prefill_ref(q, kv_cache, meta.block_tables, meta.query_start_loc,
                                 meta.seq_lens, self.scale)

"""The attention backend interface every backend (torch, triton, flashinfer) implements.

A backend owns how one layer writes its new K/V into the paged cache and attends over it. It never
allocates blocks or builds metadata: the runner does, once per step, and passes it in.
"""

from __future__ import annotations

import torch

from minirunner.attention.metadata import AttentionMetadata


class AttentionBackend:
    """One instance per engine; ``forward`` is called by every attention layer of every step.

    Subclasses override ``forward`` and may override ``plan`` (per-step work shared by all layers,
    done once before the forward pass and outside any CUDA graph).
    """

    name: str = "base"

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 block_size: int, device: torch.device, dtype: torch.dtype):
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.block_size = block_size
        self.device = device
        self.dtype = dtype

    def plan(self, meta: AttentionMetadata) -> None:
        """Per-step preparation shared by all layers (FlashInfer's plan()). Default: nothing."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Write k, v into kv_cache at meta.slot_mapping, then attend q over the paged cache.

        q: [num_tokens, num_q_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim];
        kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_dim] (this layer's).
        Returns [num_tokens, num_q_heads, head_dim].
        """
        raise NotImplementedError

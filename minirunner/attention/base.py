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
    # Whether plan_static exists: a decode step this backend runs can be compiled or captured.
    supports_graphs: bool = False
    # Whether plan_static also takes a uniform verify step (every sequence k + 1 query tokens).
    supports_verify_graphs: bool = False

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

    def plan_static(self, meta: AttentionMetadata) -> None:
        """The plan of a graph step (a decode batch padded to a bucket, block tables at full width; with
        ``supports_verify_graphs``, also a uniform verify step of ``meta.max_query_len`` queries per row):
        device tensor ops only, reading no host copy and no value that varies by step on the host side,
        so it runs inside the compiled or captured region. Default: not capturable."""
        raise NotImplementedError(f"attention backend {self.name!r} cannot run a graph step")

    def prepare_replay(self, meta: AttentionMetadata, size: int) -> None:
        """Host work before a graph step of bucket ``size`` is replayed (outside the graph), e.g.
        FlashInfer's plan() into the bucket's fixed buffers. Default: nothing."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Write k, v into kv_cache at meta.slot_mapping, then attend q over the paged cache.

        q: [num_tokens, num_q_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim];
        kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_dim] (this layer's).
        Returns [num_tokens, num_q_heads, head_dim].
        """
        raise NotImplementedError

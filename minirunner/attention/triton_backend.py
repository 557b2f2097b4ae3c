"""The Triton attention backend: the kernels of ``minirunner.kernels.paged_attention`` behind the
backend interface.

Owns only the dispatch: store_kv first, then paged_decode for decode-only batches (one query token
per sequence) and paged_prefill for everything else. Runs compiled on CUDA and in the Triton
interpreter on CPU (TRITON_INTERPRET=1, slow: for tests). For a captured decode step (graph_mode="cuda")
it holds one preallocated workspace per bucket (output and split-KV partials, the split count fixed from
the full block-table width), so nothing is allocated inside the graph. Written for CUDA graphs, not yet
run on a GPU.
"""

from __future__ import annotations

import torch

from minirunner import envs
from minirunner.attention.base import AttentionBackend
from minirunner.attention.metadata import AttentionMetadata
from minirunner.kernels.paged_attention import (
    decode_workspace,
    default_num_splits,
    paged_decode,
    paged_prefill,
    store_kv,
)


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_graphs = True
    supports_verify_graphs = True  # paged_prefill's grid and reads come from shapes and device tensors

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 block_size: int, device: torch.device, dtype: torch.dtype):
        super().__init__(num_q_heads, num_kv_heads, head_dim, scale, block_size, device, dtype)
        if torch.device(device).type == "cpu" and not envs.TRITON_INTERPRET:
            raise ValueError("attention_backend='triton' on CPU needs the Triton interpreter: set "
                             "TRITON_INTERPRET=1 before Python starts (slow; for tests), or use "
                             "attention_backend='torch'")
        self._workspaces: dict[int, tuple[int, tuple[torch.Tensor, ...]]] = {}
        self._graph_step: tuple[int, tuple[torch.Tensor, ...]] | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        self._graph_step = None  # an eager step: paged_decode picks its splits and allocates

    def prepare_replay(self, meta: AttentionMetadata, size: int) -> None:
        """Select (allocating once, before any capture) bucket ``size``'s workspace. A verify step
        (k + 1 queries per row) runs paged_prefill, which needs none."""
        if not meta.is_decode_only:
            self._graph_step = (1, ())
            return
        if size not in self._workspaces:
            width = meta.block_tables.shape[1] * self.block_size
            splits = default_num_splits(size * self.num_kv_heads, width, torch.device(self.device))
            q = torch.empty(size, self.num_q_heads, self.head_dim, dtype=self.dtype, device=self.device)
            self._workspaces[size] = (splits, decode_workspace(q, splits))
        self._graph_step = self._workspaces[size]

    def plan_static(self, meta: AttentionMetadata) -> None:
        """Nothing on the device: the kernels read block_tables and seq_lens (a padding row, seq_len 0,
        gives zeros) and stop at each row's length, so the full-width table costs no extra reads."""
        if self._graph_step is None:
            raise RuntimeError("TritonAttentionBackend.prepare_replay(meta, size) must run before a "
                               "graph step")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        store_kv(k, v, kv_cache, meta.slot_mapping)
        if meta.is_decode_only:
            if self._graph_step is not None:
                splits, workspace = self._graph_step
                return paged_decode(q, kv_cache, meta.block_tables, meta.seq_lens, self.scale,
                                    num_splits=splits, workspace=workspace)
            return paged_decode(q, kv_cache, meta.block_tables, meta.seq_lens, self.scale)
        return paged_prefill(q, kv_cache, meta.block_tables, meta.query_start_loc,
                             meta.seq_lens, self.scale)

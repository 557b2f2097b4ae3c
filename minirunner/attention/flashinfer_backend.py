"""The FlashInfer attention backend: BatchDecode / BatchPrefill wrappers over our paged KV (NHD).

Owns the per-step plan() (host page table in FlashInfer's CSR form, once per step, outside any CUDA
graph) and the dispatch to the planned wrapper. K/V are written by our store_kv kernel. flashinfer is
imported lazily: without it (or without CUDA) the constructor raises a ValueError saying what to do.
"""

from __future__ import annotations

import torch

from minirunner.attention.base import AttentionBackend
from minirunner.attention.flashinfer_pagetable import block_tables_to_csr
from minirunner.attention.metadata import AttentionMetadata
from minirunner.kernels.paged_attention import store_kv

_WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace per wrapper


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    supports_graphs = True

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 block_size: int, device: torch.device, dtype: torch.dtype):
        super().__init__(num_q_heads, num_kv_heads, head_dim, scale, block_size, device, dtype)
        try:
            import flashinfer
        except ImportError as e:
            raise ValueError(
                "attention_backend='flashinfer' needs the flashinfer-python package and a CUDA GPU "
                "(pip install 'minirunner[gpu]'); use attention_backend='triton' or 'torch'") from e
        if torch.device(device).type != "cuda":
            raise ValueError("attention_backend='flashinfer' runs on CUDA only; use 'torch' on CPU")
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"attention_backend='flashinfer' needs float16 or bfloat16, got {dtype}")
        group = num_q_heads // num_kv_heads
        self._flashinfer = flashinfer
        self._use_tensor_cores = group >= 4  # GQA groups of 4+ run faster on the prefill-style kernels
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device), kv_layout="NHD",
            use_tensor_cores=self._use_tensor_cores)
        # One workspace shared by the bucket wrappers (one replays at a time).
        self._graph_workspace: torch.Tensor | None = None
        self._graph_wrappers: dict[int, object] = {}
        self._graph_decode = None
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device), kv_layout="NHD")
        self._planned_decode: bool | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        """Build the page table on the host and plan the wrapper this step will use.

        Reads the runner's host copy of the block tables (a device-to-host copy only where the metadata
        lacks one; plan() is outside any graph). Padding
        rows (seq_len 0) are planned over one token of block 0 so every row is a valid read; their
        outputs are zeroed in forward(), as the torch backend's are.
        """
        block_tables = meta.block_tables_cpu if meta.block_tables_cpu is not None \
            else meta.block_tables.cpu()
        seq_lens = meta.seq_lens_cpu.to(torch.int32).clamp(min=1)
        indptr, indices, last_page_len = block_tables_to_csr(block_tables, seq_lens, self.block_size)
        kw = dict(q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.scale)
        if meta.is_decode_only:
            self._decode.plan(indptr, indices, last_page_len, self.num_q_heads, self.num_kv_heads,
                              self.head_dim, self.block_size, pos_encoding_mode="NONE", **kw)
        else:
            self._prefill.plan(meta.query_start_loc_cpu.to(torch.int32), indptr, indices,
                               last_page_len, self.num_q_heads, self.num_kv_heads, self.head_dim,
                               self.block_size, causal=True, **kw)
        self._planned_decode = meta.is_decode_only
        self._graph_decode = None

    def prepare_replay(self, meta: AttentionMetadata, size: int) -> None:
        """Plan bucket ``size``'s graph wrapper (built once, with fixed page-table buffers sized for
        every row at the full block-table width) from the host copies in ``meta`` (no device sync)."""
        wrapper = self._graph_wrappers.get(size)
        if wrapper is None:
            if self._graph_workspace is None:
                self._graph_workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
            i32 = dict(dtype=torch.int32, device=self.device)
            wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._graph_workspace, kv_layout="NHD", use_tensor_cores=self._use_tensor_cores,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.empty(size + 1, **i32),
                paged_kv_indices_buffer=torch.empty(size * meta.block_tables.shape[1], **i32),
                paged_kv_last_page_len_buffer=torch.empty(size, **i32))
            self._graph_wrappers[size] = wrapper
        seq_lens = meta.seq_lens_cpu.to(torch.int32).clamp(min=1)
        indptr, indices, last_page_len = block_tables_to_csr(meta.block_tables_cpu, seq_lens,
                                                             self.block_size)
        wrapper.plan(indptr, indices, last_page_len, self.num_q_heads, self.num_kv_heads, self.head_dim,
                     self.block_size, pos_encoding_mode="NONE", q_data_type=self.dtype,
                     kv_data_type=self.dtype, sm_scale=self.scale)
        self._graph_decode = wrapper

    def plan_static(self, meta: AttentionMetadata) -> None:
        """Nothing on the device: the bucket's wrapper was planned before the replay."""
        if self._graph_decode is None:
            raise RuntimeError("FlashInferAttentionBackend.prepare_replay(meta, size) must run before a "
                               "graph step")
        self._planned_decode = True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        if self._planned_decode is None or self._planned_decode != meta.is_decode_only:
            raise RuntimeError("FlashInferAttentionBackend.plan(meta) must run before each step")
        q = q.contiguous()  # the model hands q and k as views of one fused projection
        store_kv(k, v, kv_cache, meta.slot_mapping)
        if self._planned_decode:
            out = (self._graph_decode or self._decode).run(q, kv_cache)
            return torch.where((meta.seq_lens > 0)[:, None, None], out, torch.zeros_like(out))
        return self._prefill.run(q, kv_cache)

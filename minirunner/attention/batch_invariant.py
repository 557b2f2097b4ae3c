"""Batch-invariant attention (``batch_invariant=True``): every query row through one kernel and one
reduction order over its keys, whatever the step holds.

Owns the mode's backend: the torch backend's KV writes, then every query token of the step (a prompt's
or a chunk's tokens, a decode token, a verify step's k + 1 rows) attends as one row of the C kernel
(kernels/paged_decode_cpu.c): its own keys 0 .. position read through its sequence's block table, in
chunks of 64 from position 0 with an online softmax. A row's bits depend on its query, its keys and its
length only, so prefill, chunked prefill, decode and verify of one token give the same output, and no
companion, padding or grouping changes it. The torch backend's SDPA calls are not used: their order
over keys depends on the padded batch's shape.

Rows are split over the CPU's threads in whole rows (ctypes releases the GIL); each row is computed by
one thread from start to end, so the split changes nothing in it. It never runs under a compiled graph
(the mode's steps are eager).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from minirunner.attention.metadata import AttentionMetadata
from minirunner.attention.torch_backend import TorchAttentionBackend
from minirunner.attention.torch_ops import slot_rows, store_kv_padded
from minirunner.core.host_copy import to_device
from minirunner.kernels import paged_decode_cpu as cpu_kernel

MIN_ROWS_PER_THREAD = 32  # fewer rows than this per thread run on the calling thread


class BatchInvariantAttentionBackend(TorchAttentionBackend):
    """The torch backend with every query row attending through the C kernel (the module docstring)."""

    name = "torch"
    supports_graphs = False
    supports_verify_graphs = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from minirunner.worker.compile_cache import cache_dir

        if not (self.device.type == "cpu" and self.dtype == torch.float32
                and cpu_kernel.load(cache_dir() / "kernels")):
            raise RuntimeError("batch_invariant=True attends through the CPU attention kernel, which did "
                               "not build here (the WARNING above says why): install a C compiler (cc, "
                               "gcc or clang) or set CC, or leave batch_invariant off")
        self._tables: torch.Tensor | None = None
        self._lens: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    def plan(self, meta: AttentionMetadata) -> None:
        """Each query token's block-table row (its sequence's) and key count (its position + 1; 0 for a
        padding row, whose output is zeros), from the host copies."""
        qsl = meta.query_start_loc_cpu.numpy().astype(np.int64)
        seq_lens = meta.seq_lens_cpu.numpy().astype(np.int64)
        qlens = qsl[1:] - qsl[:-1]
        seq_of = np.repeat(np.arange(len(qlens)), qlens)
        first = np.repeat(qsl[:-1], qlens)
        lens = np.repeat(seq_lens - qlens, qlens) + (np.arange(int(qsl[-1])) - first) + 1
        lens = np.where(np.repeat(seq_lens, qlens) > 0, lens, 0).astype(np.int32)
        dev = meta.seq_lens.device
        tables = meta.block_tables.index_select(0, to_device(seq_of, dev))
        self._tables = tables.to(torch.int32).contiguous()
        self._lens = to_device(lens, dev)
        self._store_rows = None

    def plan_static(self, meta: AttentionMetadata) -> None:
        raise RuntimeError("batch-invariant attention runs eager steps only (no graphs)")

    def _attend(self, q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor,
                lens: torch.Tensor) -> torch.Tensor:
        rows, threads = q.shape[0], torch.get_num_threads()
        parts = min(threads, rows // MIN_ROWS_PER_THREAD)
        if parts < 2:
            return cpu_kernel.paged_decode_cpu(q, kv_cache, tables, lens, self.scale)
        if self._pool_size < parts:
            self._pool = ThreadPoolExecutor(parts, thread_name_prefix="minirunner-attention")
            self._pool_size = parts
        bounds = np.linspace(0, rows, parts + 1).astype(int)
        futures = [self._pool.submit(cpu_kernel.paged_decode_cpu, q[a:b], kv_cache, tables[a:b], lens[a:b],
                                     self.scale) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        return torch.cat([f.result() for f in futures])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        if self._store_rows is None:
            self._store_rows = slot_rows(meta.slot_mapping, kv_cache)
        store_kv_padded(k, v, kv_cache, meta.slot_mapping, self._store_rows)
        tables, lens = self._tables, self._lens
        extra = q.shape[0] - lens.shape[0]  # rows past the last sequence's (padding): zeros
        if extra > 0:
            tables = torch.cat((tables, tables.new_zeros(extra, tables.shape[1])))
            lens = torch.cat((lens, lens.new_zeros(extra)))
        return self._attend(q.contiguous(), kv_cache, tables, lens)

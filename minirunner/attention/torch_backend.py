"""The torch attention backend: vectorised over the batch, runs anywhere, the default on a CPU.

Owns attention over the paged KV cache in plain torch with no Python loop over sequences and no host
sync inside the forward: per step, ``plan`` turns the host copies of the metadata into gather indices and
masks once; per layer, ``forward`` writes K/V by slot (one ``index_copy_``), gathers each sequence's
blocks through its block table (one index per K and V, with rows computed once per step from the table),
and runs one batched ``scaled_dot_product_attention``. GQA folds the
query heads of a group into the query-length axis, so repeated KV is never materialised. The readable
per-sequence loops stay in ``minirunner.kernels.paged_attention`` (the ``*_ref`` twins the tests
compare against).

Padding rows (slot -1) are written to the cache's last block: the runner allocates one extra block that
the pool never hands out, and slot -1 lands there by floor division (block -1, offset block_size - 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minirunner.attention.base import AttentionBackend
from minirunner.attention.metadata import AttentionMetadata
from minirunner.attention.torch_ops import (
    gather_rows,
    paged_decode_cpu,
    paged_decode_fused,
    paged_decode_vectorized,
    paged_prefill_vectorized,
    slot_rows,
    store_kv_padded,
)
from minirunner.core.host_copy import to_device
from minirunner.kernels import paged_decode_cpu as cpu_kernel
from minirunner.kv.block_table import cdiv


@dataclass(slots=True)
class _DecodeGroup:
    """Sequences with one query token: their block-table rows and key mask (which rows of q they are:
    the backend's ``_decode_rows``)."""

    k_rows: torch.Tensor  # int64 [2, n, L]: cache rows of each sequence's K and V slots (gather_rows)
    key_mask: torch.Tensor
    row_valid: torch.Tensor | None
    # a graph step's block tables and lengths, for the CPU kernel (paged_decode_cpu); None otherwise
    block_tables: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None


@dataclass(slots=True)
class _PrefillGroup:
    """Sequences with several query tokens, padded to max_q: where each token goes and its mask."""

    # int64 [n_tokens]: rows of q, and of the [n_seqs * max_q] padded layout; both None when every
    # sequence has max_q queries (a verify step): q is already that layout, nothing is moved
    token_rows: torch.Tensor | None
    padded_rows: torch.Tensor | None
    num_seqs: int
    max_q: int
    k_rows: torch.Tensor
    mask: torch.Tensor


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    supports_graphs = True
    supports_verify_graphs = True

    # Decode sequences of very different lengths are split into up to this many groups by length, each
    # padded to its own longest, when that cuts the padded K/V gathered by a quarter or more. A group
    # costs about eight more operators per layer; from six sequences up, the gather it saves on
    # ShareGPT-like lengths outweighs them on the embedded model.
    MAX_DECODE_GROUPS = 6
    MIN_GROUP_SIZE = 6
    # Prefill sequences likewise, by context length: a prefill group is a larger share of the step, so
    # groups of two pay already.
    MAX_PREFILL_GROUPS = 4
    MIN_GROUP_SIZE_PREFILL = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._decode: list[_DecodeGroup] = []
        self._prefill: list[_PrefillGroup] = []
        self._store_rows: torch.Tensor | None = None
        # The decode rows in group order, when they are not the whole batch in order (several length
        # groups, or decode rows beside prefill rows); None: q is the one decode group as it stands.
        self._decode_rows: torch.Tensor | None = None
        self._decode_bounds: list[int] = []
        self._decode_inverse: torch.Tensor | None = None
        # A captured step needs one static decode group (no length-dependent split): graph runners
        # turn this off.
        self.split_decode_by_length = True
        # Whether a compiled decode step attends through the C kernel (use_cpu_kernel).
        self.cpu_kernel = False

    def use_cpu_kernel(self, folder) -> None:
        """Let compiled decode steps attend through the C kernel (kernels/paged_decode_cpu.py), built
        into (or found in) ``folder``, where this backend runs float32 on the CPU and it builds. Called
        by the compile-mode graph runner before its first trace (a build cannot be traced)."""
        self.cpu_kernel = (self.device.type == "cpu" and self.dtype == torch.float32
                           and cpu_kernel.load(folder))

    # -- per step ---------------------------------------------------------------------------------
    def plan(self, meta: AttentionMetadata) -> None:
        """Split the batch into single-token (decode) and multi-token (prefill/extend) sequences and
        build each group's indices and masks from the host copies: once per step, for every layer."""
        qsl = meta.query_start_loc_cpu.numpy().astype(np.int64)
        seq_lens = meta.seq_lens_cpu.numpy().astype(np.int64)
        qlens = qsl[1:] - qsl[:-1]
        self._decode, self._prefill, self._decode_rows = [], [], None
        self._store_rows = None  # needs the cache's size: computed by the first layer of the step
        if meta.is_decode_only:
            groups = self._length_groups(seq_lens)
            if len(groups) == 1:  # the whole batch in order: no gather of q, no scatter of outputs
                self._decode = [self._plan_decode(meta, None, seq_lens)]
            else:
                self._decode = [self._plan_decode(meta, g, seq_lens[g]) for g in groups]
                self._plan_decode_order(groups, meta, inverse=True)
            return
        dec = np.flatnonzero((qlens == 1) & (seq_lens > 0))
        pre = np.flatnonzero((qlens > 1) & (seq_lens > 0))
        if dec.size:
            groups = self._length_groups(seq_lens[dec])
            self._decode = [self._plan_decode(meta, dec[g], seq_lens[dec[g]]) for g in groups]
            self._plan_decode_order([qsl[dec[g]] for g in groups], meta, inverse=False)
        if pre.size:
            self._prefill = [self._plan_prefill(meta, pre[g], qsl, seq_lens)
                             for g in self._length_groups(seq_lens[pre], qlens[pre])]

    def plan_static(self, meta: AttentionMetadata) -> None:
        """The capturable plan of a graph step: block tables at their full width, masks from seq_lens,
        all device ops on the step's static buffers (no host copy read), so the step traces with the
        same shapes every time for a bucket. A decode step is one decode group; a uniform verify step
        (every sequence ``meta.max_query_len`` = k + 1 queries, its last known token and k drafts) is
        one prefill group with no padding. Costs gathering max_model_len keys per row (the price of a
        static shape for this backend; the triton and flashinfer kernels read seq_lens and stop
        early)."""
        lens, q_len = meta.seq_lens, meta.max_query_len
        key_pos = torch.arange(meta.block_tables.shape[1] * self.block_size, device=lens.device)
        rows = gather_rows(meta.block_tables, self.block_size)
        self._prefill, self._store_rows, self._decode_rows = [], None, None
        if q_len == 1:
            key_mask = (key_pos[None, :] < lens.clamp(min=1)[:, None])[:, None, None, :]
            row_valid = (lens > 0).to(self.dtype)[:, None, None]
            tables = (meta.block_tables, lens) if self.cpu_kernel else (None, None)
            self._decode = [_DecodeGroup(rows, key_mask, row_valid, *tables)]
            return
        n = lens.shape[0]
        # Query i of a sequence sits at position seq_len - q_len + i; a padding row (seq_len 0) sees key
        # 0 only, so its softmax stays finite (its output is never read).
        q_pos = ((lens[:, None] - q_len) + torch.arange(q_len, device=lens.device)[None, :]).clamp(min=0)
        allowed = key_pos[None, None, :] <= q_pos[:, :, None]
        group = self.num_q_heads // self.num_kv_heads
        mask = allowed.repeat_interleave(group, dim=1)[:, None]  # row i * G + g
        self._decode = []
        self._prefill = [_PrefillGroup(None, None, n, q_len, rows, mask)]

    def _columns(self, max_len: int) -> int:
        return max(1, cdiv(int(max_len), self.block_size))

    def _length_groups(self, seq_lens: np.ndarray,
                       query_lens: np.ndarray | None = None) -> list[np.ndarray]:
        """Indices into seq_lens, one array per group: all of them in order, or consecutive runs of the
        length-sorted order when padding each run to its own longest cuts the padded attention work
        (sequences x queries x keys) by a quarter or more. Decode rows (``query_lens`` None: one query
        each): the K/V gathered. Prefill rows: prompts admitted together have very different lengths
        (on ShareGPT-like lengths one padded group computed about five times the real scores)."""
        n = len(seq_lens)
        if query_lens is None:
            if not self.split_decode_by_length:
                return [np.arange(n)]
            k = min(self.MAX_DECODE_GROUPS, n // self.MIN_GROUP_SIZE)
            query_lens = np.ones(n, dtype=np.int64)
        else:
            k = min(self.MAX_PREFILL_GROUPS, n // self.MIN_GROUP_SIZE_PREFILL)
        if k < 2:
            return [np.arange(n)]
        groups = np.array_split(np.argsort(seq_lens, kind="stable"), k)

        def cost(g):
            return len(g) * int(query_lens[g].max()) * self._columns(seq_lens[g].max())
        if sum(cost(g) for g in groups) > 0.75 * cost(np.arange(n)):
            return [np.arange(n)]
        return groups

    def _plan_decode_order(self, token_rows: list[np.ndarray], meta: AttentionMetadata,
                           inverse: bool) -> None:
        """The decode rows of q, group after group (each group a contiguous slice, so a layer gathers q
        and places the outputs once for all groups), and, for a decode-only step (a permutation of all
        rows), its inverse."""
        dev = meta.seq_lens.device
        order = np.concatenate(token_rows)
        self._decode_rows = to_device(order, dev)
        self._decode_bounds = np.cumsum([0] + [len(t) for t in token_rows]).tolist()
        self._decode_inverse = None
        if inverse:
            self._decode_inverse = to_device(np.argsort(order, kind="stable"), dev)

    def _group_rows(self, meta: AttentionMetadata, idx: np.ndarray | None, nb: int) -> torch.Tensor:
        """:func:`gather_rows` of the first ``nb`` block-table columns of a group's sequences (``idx``;
        None: all of them in order). On a CPU from the runner's host copy of the tables with numpy (a few
        µs, where each torch operator costs about ten), on a GPU on the device (no copy of the rows)."""
        dev, bs = meta.seq_lens.device, self.block_size
        if dev.type != "cpu" or meta.block_tables_cpu is None:
            tables = meta.block_tables[:, :nb] if idx is None else \
                meta.block_tables[to_device(idx, dev), :nb]
            return gather_rows(tables, bs)
        tables = meta.block_tables_cpu.numpy()
        tables = tables[:, :nb] if idx is None else tables[idx, :nb]
        k_rows = (tables.astype(np.int64)[:, :, None] * (2 * bs) + np.arange(bs)).reshape(len(tables), -1)
        return torch.from_numpy(np.stack((k_rows, k_rows + bs)))

    def _plan_decode(self, meta: AttentionMetadata, idx: np.ndarray | None,
                     seq_lens: np.ndarray) -> _DecodeGroup:
        """Indices and masks of one decode group (the batch's rows ``idx``, None for all of them in
        order; ``seq_lens`` theirs, from the host copy)."""
        dev = meta.seq_lens.device
        nb = self._columns(seq_lens.max(initial=1))
        # A padding row (seq_len 0) attends to key 0 so softmax stays finite; its output is zeroed.
        if dev.type == "cpu":  # numpy on the host copy, as the rows
            key_mask = torch.from_numpy((np.arange(nb * self.block_size)[None, :]
                                         < np.maximum(seq_lens, 1)[:, None])[:, None, None, :])
        else:
            lens = meta.seq_lens if idx is None else meta.seq_lens[to_device(idx, dev)]
            key_mask = (torch.arange(nb * self.block_size, device=dev)[None, :]
                        < lens.clamp(min=1)[:, None])[:, None, None, :]
        row_valid = None
        if (seq_lens == 0).any():
            row_valid = to_device((seq_lens > 0)[:, None, None], dev, self.dtype)
        return _DecodeGroup(self._group_rows(meta, idx, nb), key_mask, row_valid)

    def _plan_prefill(self, meta: AttentionMetadata, idx: np.ndarray, qsl: np.ndarray,
                      seq_lens: np.ndarray) -> _PrefillGroup:
        dev = meta.seq_lens.device
        starts, qlens, lens = qsl[idx], qsl[idx + 1] - qsl[idx], seq_lens[idx]
        max_q, n = int(qlens.max()), len(idx)
        rows = (None, None)  # every sequence with max_q queries: q is already the padded layout
        if n < len(qsl) - 1 or (qlens < max_q).any():
            local = np.arange(int(qlens.sum())) - np.repeat(np.cumsum(qlens) - qlens, qlens)
            token_rows = np.repeat(starts, qlens) + local
            padded_rows = np.repeat(np.arange(n), qlens) * max_q + local
            rows = (to_device(token_rows, dev), to_device(padded_rows, dev))
        nb = self._columns(lens.max())
        q_pos = (lens - qlens)[:, None] + np.arange(max_q)[None, :]  # [n, max_q]
        key_pos = np.arange(nb * self.block_size)
        allowed = key_pos[None, None, :] <= q_pos[:, :, None]  # causal; padded rows stay finite
        group = self.num_q_heads // self.num_kv_heads
        mask = np.repeat(allowed, group, axis=1)[:, None]  # row i * G + g
        return _PrefillGroup(*rows, n, max_q, self._group_rows(meta, idx, nb),
                             to_device(mask, dev))

    # -- per layer --------------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        if self._store_rows is None:
            self._store_rows = slot_rows(meta.slot_mapping, kv_cache)
        store_kv_padded(k, v, kv_cache, meta.slot_mapping, self._store_rows)
        dec, pres = self._decode, self._prefill
        if len(dec) == 1 and self._decode_rows is None:
            g = dec[0]
            # a compiled step (graph_mode="compile"): the CPU kernel, else the form inductor fuses; eager,
            # gather + SDPA
            if not torch.compiler.is_compiling():
                return paged_decode_vectorized(q, kv_cache, g.k_rows, g.key_mask, g.row_valid, self.scale)
            if g.block_tables is not None and cpu_kernel.supports(q, kv_cache, g.block_tables, g.seq_lens):
                return paged_decode_cpu(q, kv_cache, g.block_tables, g.seq_lens, self.scale)
            return paged_decode_fused(q, kv_cache, g.k_rows, g.key_mask, g.row_valid, self.scale)
        if len(pres) == 1 and pres[0].token_rows is None:  # uniform queries, in order, no decode rows
            pre = pres[0]
            o = paged_prefill_vectorized(q.view(pre.num_seqs, pre.max_q, *q.shape[1:]), kv_cache,
                                         pre.k_rows, pre.mask, self.scale)
            return o.reshape(q.shape)
        if dec:  # length groups: q gathered once in group order, each group a slice of it
            qs, b = q.index_select(0, self._decode_rows), self._decode_bounds
            outs = torch.cat([paged_decode_vectorized(qs[b[i]:b[i + 1]], kv_cache, g.k_rows, g.key_mask,
                                                      g.row_valid, self.scale)
                              for i, g in enumerate(dec)])
            if not pres:  # a decode-only step: the groups hold every row
                return outs.index_select(0, self._decode_inverse)
        out = torch.zeros_like(q)
        if dec:
            out.index_copy_(0, self._decode_rows, outs)
        for pre in pres:
            q_pad = q.new_zeros(pre.num_seqs * pre.max_q, *q.shape[1:])
            q_pad[pre.padded_rows] = q[pre.token_rows]
            o = paged_prefill_vectorized(q_pad.view(pre.num_seqs, pre.max_q, *q.shape[1:]), kv_cache,
                                         pre.k_rows, pre.mask, self.scale)
            out[pre.token_rows] = o.reshape(-1, *q.shape[1:])[pre.padded_rows]
        return out

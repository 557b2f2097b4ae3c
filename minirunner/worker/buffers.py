"""The step's static buffers: device tensors, each with a host mirror (pinned on CUDA), written in one place.

Owns their allocation (once, at the maximum size: a compiled or captured step replays over this storage,
so it is never reallocated), every write into them — host arrays staged through the mirror and copied
without blocking, device tensors copied on the device (a step scheduled ahead), padding rows included —
and the attention-metadata views a graph step reads. Every row of a graph step's bucket is written each
step (padding rows: token 0, position 0, slot -1, seq_len 0, block-table row 0, greedy), so no step reads
a stale tail. On the GPU-native input path it runs the input-prep kernel
(minirunner/kernels/input_prep.py) that fills
positions, slots, seq_lens, query_start_loc and block tables from the state rows' device mirrors
(worker/state_mirror.py), and writes only the host mirrors the host plans from. It never decides what goes
in (input preparation, worker/input_batch.py, does) and never runs the model.
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.attention import AttentionMetadata
from minirunner.core.host_copy import pinned, to_device
from minirunner.kv.block_table import slot_of

# The one definition of a graph step's padding rows: token 0 at position 0, slot -1 (the null block),
# seq_len 0, block-table row 0, greedy sampling (temperature 0, top-k 0, top-p 1, seed 0) at position 0.
PAD = dict(input_ids=0, positions=0, slot_mapping=-1, seq_lens=0, block_tables=0, temperatures=0, top_k=0,
           top_p=1, seeds=0, sample_positions=0)


class StepBuffers:
    """input_ids, positions, slot_mapping: int64 [max tokens]; query_start_loc int32 [max seqs + 1];
    seq_lens int32 [max seqs]; block_tables int32 [max seqs, max blocks per seq]; logits_indices int64
    [max tokens]; sample_positions int64, temperatures fp32, top_k int64, top_p fp32, seeds int64 [max
    seqs] (a graph step's sampling parameters, read inside the replay)."""

    def __init__(self, device: torch.device, max_num_batched_tokens: int, max_num_seqs: int,
                 max_blocks_per_seq: int, block_size: int):
        self.device, self.block_size, self.max_blocks_per_seq = device, block_size, max_blocks_per_seq
        T, S = max_num_batched_tokens, max_num_seqs
        self._host: dict[int, tuple[torch.Tensor, np.ndarray]] = {}
        self.input_ids = self._alloc(T, torch.int64)
        self.positions = self._alloc(T, torch.int64)
        self.slot_mapping = self._alloc(T, torch.int64, fill=-1)
        self.query_start_loc = self._alloc(S + 1, torch.int32)
        self.seq_lens = self._alloc(S, torch.int32)
        self.block_tables = self._alloc((S, max_blocks_per_seq), torch.int32)
        self.logits_indices = self._alloc(T, torch.int64)  # a speculative request scores k + 1 rows
        self.sample_positions = self._alloc(S, torch.int64)
        self.temperatures = self._alloc(S, torch.float32)
        self.top_k = self._alloc(S, torch.int64)
        self.top_p = self._alloc(S, torch.float32)
        self.seeds = self._alloc(S, torch.int64)
        self._static_meta: dict[tuple[int, int], AttentionMetadata] = {}
        self._uniform_qsl: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def max_num_tokens(self) -> int:
        return self.input_ids.shape[0]

    def _alloc(self, shape, dtype, fill: int = 0) -> torch.Tensor:
        buf = torch.full(shape if isinstance(shape, tuple) else (shape,), fill, dtype=dtype,
                         device=self.device)
        # The host side: a pinned mirror on CUDA (copies then do not block the host), the buffer itself
        # on a CPU (no copy at all).
        host = torch.empty_like(buf, device="cpu").pin_memory() if buf.device.type == "cuda" else buf
        self._host[buf.data_ptr()] = (host, host.numpy())
        return buf

    def host(self, buf: torch.Tensor) -> torch.Tensor:
        """The host mirror of a buffer (the buffer itself on a CPU)."""
        return self._host[buf.data_ptr()][0]

    # -- host writes ----------------------------------------------------------------------------
    def put(self, buf: torch.Tensor, arr: np.ndarray, own_host: bool = False) -> torch.Tensor:
        """Write a host array into the front of a buffer; returns the view. ``own_host``: stage it through
        a fresh pinned copy instead of the mirror (a step launched ahead: the mirror may still be read by
        a copy in flight)."""
        index = tuple(slice(0, n) for n in arr.shape)
        view = buf[index]
        if own_host:
            view.copy_(pinned(arr, buf.device), non_blocking=True)
            return view
        host, host_np = self._host[buf.data_ptr()]
        host_np[index] = arr
        if host is not buf:
            view.copy_(host[index], non_blocking=True)
        return view

    def put_rows(self, buf: torch.Tensor, start: int, arr: np.ndarray) -> None:
        """Write a host array into rows [start, start + len(arr)) of a buffer."""
        host, host_np = self._host[buf.data_ptr()]
        end = start + len(arr)
        host_np[start:end] = arr
        if host is not buf:
            buf[start:end].copy_(host[start:end], non_blocking=True)

    def put_meta(self, positions, slots, qsl, seq_lens, num_seqs: int, max_query_len: int,
                 max_seq_len: int, tables_cpu: torch.Tensor | None) -> AttentionMetadata:
        """Write a step's metadata arrays; the metadata of their views."""
        return AttentionMetadata(
            positions=self.put(self.positions, positions),
            slot_mapping=self.put(self.slot_mapping, slots),
            query_start_loc=self.put(self.query_start_loc, qsl),
            seq_lens=self.put(self.seq_lens, seq_lens),
            block_tables=self.block_tables[:num_seqs],
            query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens_cpu=torch.from_numpy(seq_lens),
            max_query_len=max_query_len, max_seq_len=max_seq_len, block_size=self.block_size,
            block_tables_cpu=tables_cpu)

    def put_tables(self, tables: np.ndarray) -> torch.Tensor:
        """Write an eager step's block-table rows (only the columns its longest sequence reaches);
        returns their host copy, which the backends plan from without reading the device."""
        self.put(self.block_tables, tables)
        return self.host(self.block_tables)[:tables.shape[0], :tables.shape[1]]

    def put_graph_rows(self, tables: np.ndarray, sampling: dict[str, np.ndarray] | None, bucket: int,
                       own_host: bool = False) -> None:
        """A graph step's per-row inputs for the first n rows, padded to ``bucket``: the block tables at
        full width (zeros for padding) and, with ``sampling`` (temperatures, top_k, top_p, seeds: [n]
        each), the sampling parameters (padding: 0, 0, 1, 0 — greedy)."""
        self.put(self.block_tables, self._full_width(tables, bucket), own_host)
        if sampling is not None:
            self.put_sampling_rows(sampling, bucket, own_host)

    def put_sampling_rows(self, sampling: dict[str, np.ndarray], bucket: int, own_host: bool = False) -> None:
        """A graph step's sampling parameters (temperatures, top_k, top_p, seeds: [n] each), padded to
        ``bucket`` rows with 0, 0, 1, 0 (greedy)."""
        for name in ("temperatures", "top_k", "top_p", "seeds"):
            values = sampling[name]
            self.put(getattr(self, name), np.concatenate((values, np.full(bucket - len(values), PAD[name],
                                                                          values.dtype))), own_host)

    def _full_width(self, tables: np.ndarray, bucket: int) -> np.ndarray:
        """Block-table rows at full width, padded with rows of zeros to ``bucket`` rows."""
        full = np.full((bucket, self.max_blocks_per_seq), PAD["block_tables"], dtype=np.int32)
        full[:tables.shape[0]] = tables
        return full

    def write_padding_rows(self, start: int, end: int, query_len: int = 1) -> None:
        """Rows [start, end) of the graph-step buffers become padding rows of ``query_len`` tokens each:
        token 0 at position 0, slot -1 (the null block), seq_len 0, block-table row 0, greedy;
        query_start_loc[: end + 1] = 0, q, 2q, ..."""
        n, q = end - start, query_len
        for name in ("input_ids", "positions", "slot_mapping"):
            self.put_rows(getattr(self, name), start * q, np.full(n * q, PAD[name]))
        for name in ("seq_lens", "temperatures", "top_k", "top_p", "seeds", "sample_positions"):
            self.put_rows(getattr(self, name), start, np.full(n, PAD[name]))
        self.put_rows(self.block_tables, start, np.full((n, self.max_blocks_per_seq), PAD["block_tables"],
                                                        np.int32))
        self.put(self.query_start_loc, np.arange(end + 1, dtype=np.int32) * q)

    # -- the GPU-native input path: the input-prep kernel writes the metadata on the device -----------
    def fill_on_device(self, kernel, idx_mapping: torch.Tensor, query_lens: torch.Tensor,
                       num_computed: torch.Tensor, state_tables: torch.Tensor, num_tokens: int,
                       qsl: np.ndarray, seq_lens: np.ndarray, max_query_len: int, max_seq_len: int,
                       tables_cpu: torch.Tensor | None, pad_query_len: int = 0) -> AttentionMetadata:
        """Run ``kernel`` (kernels.input_prep.prepare_inputs or its twin) over the state rows' device
        mirrors (``num_computed`` int32 [rows], ``state_tables`` int32 [rows, max blocks]) for this
        step's ``idx_mapping`` and ``query_lens`` (int32 [n], on the device): it writes positions, slots,
        seq_lens, query_start_loc and the batch's block tables over every row of the buffers (padding
        rows of ``pad_query_len`` tokens each). Returns the metadata of the first ``num_tokens`` tokens
        and ``len(seq_lens)`` sequences; ``qsl``, ``seq_lens`` (host arrays the host already knows) and
        ``tables_cpu`` are its host copies."""
        kernel(idx_mapping, query_lens, num_computed, state_tables, self.block_size, self.positions,
               self.slot_mapping, self.seq_lens, self.query_start_loc, self.block_tables,
               pad_query_len=pad_query_len)
        n = len(seq_lens)
        return AttentionMetadata(
            positions=self.positions[:num_tokens], slot_mapping=self.slot_mapping[:num_tokens],
            query_start_loc=self.query_start_loc[:n + 1], seq_lens=self.seq_lens[:n],
            block_tables=self.block_tables[:n],
            query_start_loc_cpu=torch.from_numpy(qsl), seq_lens_cpu=torch.from_numpy(seq_lens),
            max_query_len=max_query_len, max_seq_len=max_seq_len, block_size=self.block_size,
            block_tables_cpu=tables_cpu)

    def put_graph_host_rows(self, tables: np.ndarray, qsl: np.ndarray, seq_lens: np.ndarray,
                            bucket: int) -> None:
        """The host mirrors a graph step's plan reads (``static_meta``'s host copies), for a step whose
        device side the input-prep kernel fills: query_start_loc [bucket + 1], seq_lens [bucket] and the
        block tables at full width (zeros for padding). On a CPU the mirror is the buffer itself, which
        the kernel fills: nothing to write."""
        for buf, arr in ((self.query_start_loc, qsl), (self.seq_lens, seq_lens),
                         (self.block_tables, self._full_width(tables, bucket))):
            host = self.host(buf)
            if host is not buf:
                host.numpy()[tuple(slice(0, k) for k in arr.shape)] = arr

    # -- device writes (a step built from the previous step's outputs, no host round trip) ----------
    def gather_input_ids(self, pairs: np.ndarray, tokens: torch.Tensor) -> None:
        """input_ids[row] = tokens[i] for each (row, i) of ``pairs`` (int64 [m, 2], host), on the device:
        tokens a step still in flight sampled, fed to the next step without reaching the host."""
        idx = to_device(pairs.T, self.device)
        self.input_ids.index_copy_(0, idx[0], tokens.index_select(0, idx[1]))

    def write_uniform(self, bucket: int, n: int, ids: torch.Tensor, positions: torch.Tensor,
                      sample_positions: torch.Tensor | None = None,
                      slots: torch.Tensor | None = None) -> None:
        """Rows [0, bucket) for a uniform graph step of q tokens per row, on the device: rows < n from
        ids, positions and ``slots`` (int64 [n, q]; None: from the block tables already written); rows
        >= n padding rows as ``write_padding_rows`` leaves them; query_start_loc 0, q, 2q, ...;
        ``sample_positions`` (int64 [n], padding 0) when the step samples."""
        q = ids.shape[1]
        m, total = n * q, bucket * q
        if slots is None:
            slots = slot_of(self.block_tables[:n].long(), positions, self.block_size)
        for buf, value, name in ((self.input_ids, ids, "input_ids"), (self.positions, positions, "positions"),
                                 (self.slot_mapping, slots, "slot_mapping")):
            buf[:m].copy_(value.reshape(-1))
            if m < total:
                buf[m:total].fill_(PAD[name])
        self.seq_lens[:n].copy_(positions[:, -1] + 1)
        if n < bucket:
            self.seq_lens[n:bucket].fill_(PAD["seq_lens"])
        if sample_positions is not None:
            self.sample_positions[:n].copy_(sample_positions)
            if n < bucket:
                self.sample_positions[n:bucket].fill_(PAD["sample_positions"])
        qsl = self._uniform_qsl.get((bucket, q))
        if qsl is None:
            qsl = self._uniform_qsl[(bucket, q)] = torch.arange(bucket + 1, dtype=torch.int32,
                                                                device=self.device) * q
        self.query_start_loc[:bucket + 1].copy_(qsl)

    # -- what a graph step reads ------------------------------------------------------------------
    def static_meta(self, size: int, query_len: int = 1) -> AttentionMetadata:
        """The metadata a graph step of bucket ``size`` reads: views of the first ``size`` rows (and
        ``size * query_len`` token rows: 1 for decode, k + 1 for verify) of the buffers (fixed storage),
        the block tables at their full width (a static shape)."""
        meta = self._static_meta.get((size, query_len))
        if meta is None:
            qsl, lens = self.query_start_loc[:size + 1], self.seq_lens[:size]
            tables, n = self.block_tables[:size], size * query_len
            meta = self._static_meta[(size, query_len)] = AttentionMetadata(
                positions=self.positions[:n], slot_mapping=self.slot_mapping[:n],
                query_start_loc=qsl, seq_lens=lens, block_tables=tables,
                query_start_loc_cpu=self.host(qsl)[:size + 1],
                seq_lens_cpu=self.host(lens)[:size],
                max_query_len=query_len, max_seq_len=self.max_blocks_per_seq * self.block_size,
                block_size=self.block_size,
                block_tables_cpu=self.host(tables)[:size])
        return meta

    def sampling_params(self, size: int) -> tuple[torch.Tensor, ...]:
        """(temperatures, top_k, top_p, seeds, sample_positions) of a graph step's first ``size`` rows."""
        return (self.temperatures[:size], self.top_k[:size], self.top_p[:size], self.seeds[:size],
                self.sample_positions[:size])

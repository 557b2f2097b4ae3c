"""Input preparation: a step's SchedulerOutput into an InputBatch over the static buffers (MRv2's
``prepare_inputs``).

Owns what each buffer row holds for a step: token ids (known tokens, then speculative drafts), positions,
slots (the one formula, kv/block_table.py), query_start_loc, seq_lens, block-table rows, the rows whose
logits are computed, and for a graph step the padding to its bucket. Two paths fill the same buffers: the
host path (numpy, no device sync: the CPU default) and the GPU-native path (the CUDA default), where the
host sends only the step's idx_mapping, query lengths, token ids and the state rows' changed cells
(worker/state_mirror.py) and the input-prep kernel computes positions, slots, seq_lens, query_start_loc and
the block-table gather on the device. Every write goes through worker/buffers.py. It reads the step as
data (core/sched/output.py) and writes each request's query tokens to its worker row (worker/states.py);
it never allocates blocks, runs the model or samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minirunner.attention import AttentionMetadata
from minirunner.core.host_copy import to_device
from minirunner.core.sched.output import SchedulerOutput
from minirunner.kv.block_table import cdiv, slot_of
from minirunner.worker.async_output import PrevSampled
from minirunner.worker.buffers import PAD, StepBuffers
from minirunner.worker.state_mirror import StateMirror
from minirunner.worker.states import CachedRequestState, RequestStateRows


@dataclass(slots=True)
class InputBatch:
    """What ``prepare_input_batch`` hands the later stages: views of the static buffers for this step.

    input_ids: int64 [num_tokens]; logits_indices: int64 [num_sampling + num_draft_tokens] (the flat
    rows whose logits are computed: for every request that samples, its last known token's row, then one
    row per speculative draft); sample_rows: the sampling requests' state rows (host); sample_positions:
    int64 [num_sampling] (position of the first token each samples); sample_states: those requests'
    worker state, in order.
    """

    input_ids: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sample_rows: np.ndarray
    sample_positions: torch.Tensor
    sample_states: list[CachedRequestState]
    draft_token_ids: np.ndarray  # int64 [num_draft_tokens]: speculative drafts, request by request
    num_drafts: np.ndarray  # int64 [num_sampling]: drafts of each sampling request


def prepare_input_batch(state: RequestStateRows, buffers: StepBuffers, sched: SchedulerOutput,
                        bucket: int | None = None, query_len: int = 1,
                        mirror: StateMirror | None = None, prev: PrevSampled | None = None) -> InputBatch:
    """Fill the step buffers from the scheduler's data (no device sync). The state rows must hold the
    step's requests already (``RequestStateRows.update``); each request's query tokens are written to
    its row here.

    ``bucket``: a uniform batch (every request ``query_len`` tokens: 1 for decode, k + 1 for a
    verify step) padded to this many rows for a graph step: rows past the batch become padding
    rows, block tables are written at their full width, and the sampling parameters go to their
    static buffers; the returned metadata describes the padded batch. ``mirror``: the state rows'
    device mirrors, for the GPU-native path (None: the host path); both fill identical buffers.
    ``prev``: the tokens sampled by the step still in flight (async scheduling); a request's token the
    host has not read yet is gathered from them on the device."""
    num_scheduled = sched.num_scheduled_tokens
    S = len(num_scheduled)
    b = buffers
    rows = np.empty(S, dtype=np.int64)
    qlens = np.empty(S, dtype=np.int64)
    starts = np.empty(S, dtype=np.int64)
    samples = np.empty(S, dtype=bool)
    num_drafts = np.zeros(S, dtype=np.int64)
    drafts: list[int] = []
    T = sched.total_num_scheduled_tokens
    ids = np.empty(T, dtype=np.int64)
    in_flight: list[tuple[int, int]] = []  # (token row, row in prev.tokens)
    computed = sched.num_computed_tokens()
    no_drafts: list[int] = []
    t = 0
    for i, (rid, n) in enumerate(num_scheduled.items()):
        start = computed[rid]
        rows[i] = row = state.row_of[rid]
        known_ids = sched.new_token_ids[rid]
        known = len(known_ids)
        spec = sched.scheduled_spec_decode_tokens.get(rid, no_drafts)
        state.requests[row].write_tokens(start, known_ids, spec)
        ids[t:t + known] = known_ids
        if rid in sched.in_flight_req_ids:  # its last token is still on the device
            in_flight.append((t + known, prev.row_of[rid]))
            ids[t + known] = 0
        if spec:  # speculative tokens follow the known ones
            ids[t + n - len(spec):t + n] = spec
            num_drafts[i] = len(spec)
            drafts += spec
        qlens[i], starts[i], samples[i] = n, start, rid in sched.sampling_req_ids
        t += n
    qsl = np.zeros(S + 1, dtype=np.int32)
    np.cumsum(qlens, out=qsl[1:])
    seq_lens = (starts + qlens).astype(np.int32)
    max_seq_len = int(seq_lens.max())
    # logits_indices: each sampling request's last known token, then each of its drafts
    d = num_drafts[samples]
    width = d + 1
    logits_rows = np.repeat(qsl[1:][samples] - width, width) \
        + np.arange(int(width.sum())) - np.repeat(np.cumsum(width) - width, width)
    sample_positions = (seq_lens[samples] - d).astype(np.int64)  # of the first token sampled
    pad_tokens = None
    if bucket is not None and (qlens < query_len).any():  # a verify step's rows with fewer drafts
        ids, qlens, qsl, pad_tokens, dest = _pad_short_rows(ids, qlens, query_len)
        in_flight = [(int(dest[t]), j) for t, j in in_flight]
        T, seq_lens = len(ids), (starts + qlens).astype(np.int32)
        max_seq_len = int(seq_lens.max())
    if mirror is not None:
        meta, ids, sample_positions = _prepare_on_device(mirror, state, b, rows, qlens, starts, ids, qsl,
                                                         seq_lens, sample_positions, bucket, query_len)
        if pad_tokens is not None:
            b.slot_mapping.index_fill_(0, to_device(pad_tokens, b.device), PAD["slot_mapping"])
    else:
        positions = np.repeat(starts - qsl[:-1], qlens) + np.arange(T)
        slots = _slots(state, b.block_size, np.repeat(rows, qlens), positions)
        if pad_tokens is not None:
            slots[pad_tokens] = PAD["slot_mapping"]
        tables_cpu = None
        if bucket is None:
            tables_cpu = b.put_tables(state.block_tables[rows, :cdiv(max_seq_len, b.block_size)])
        else:  # every request samples: the padded rows follow the batch's
            ids, positions, slots, seq_lens, qsl, sample_positions = _pad_uniform(state, b,
                ids, positions, slots, seq_lens, sample_positions, rows, bucket, query_len)
            S = bucket
        meta = b.put_meta(positions, slots, qsl, seq_lens, S, int(qlens.max()), max_seq_len, tables_cpu)
    input_ids = b.put(b.input_ids, ids)
    if in_flight:
        b.gather_input_ids(np.asarray(in_flight, dtype=np.int64), prev.tokens)
    return InputBatch(
        input_ids=input_ids,
        meta=meta,
        logits_indices=b.put(b.logits_indices, logits_rows),
        sample_rows=rows[samples],
        sample_positions=b.put(b.sample_positions, sample_positions),
        sample_states=[state.requests[row] for row in rows[samples]],
        draft_token_ids=np.asarray(drafts, dtype=np.int64),
        num_drafts=d,
    )


def _pad_short_rows(ids: np.ndarray, qlens: np.ndarray, query_len: int):
    """A graph verify step's rows with fewer than k drafts (``qlens`` < ``query_len``), padded inside
    the row to ``query_len`` tokens: token 0 at the next positions, slot -1 (the null block: nothing of
    the request is written), its sequence counted to the row's end so every query token keeps its
    position (attention is causal: the real tokens never see the padding). The sampler after the
    forward reads only the real rows' logits. Returns (ids, query lengths, query_start_loc, the padding
    token rows, where each old token row went)."""
    S, q = len(qlens), query_len
    dest = np.repeat(np.arange(S) * q, qlens) + np.arange(len(ids)) \
        - np.repeat(np.cumsum(qlens) - qlens, qlens)
    new_ids = np.full(S * q, PAD["input_ids"], dtype=ids.dtype)
    new_ids[dest] = ids
    real = np.zeros(S * q, dtype=bool)
    real[dest] = True
    return (new_ids, np.full(S, q, dtype=qlens.dtype), np.arange(S + 1, dtype=np.int32) * q,
            np.flatnonzero(~real), dest)


def _pad_uniform(state: RequestStateRows, buffers: StepBuffers, ids, positions, slots, seq_lens,
                 sample_positions, rows: np.ndarray, bucket: int, query_len: int):
    """Pad a uniform batch's arrays to ``bucket`` rows (of ``query_len`` tokens each) and write the
    graph step's static buffers."""
    pad = bucket - len(rows)

    def padded(arr, value, per_row=1):
        return np.concatenate((arr, np.full(pad * per_row, value, dtype=arr.dtype)))

    tables, sampling = graph_rows(state, rows)
    buffers.put_graph_rows(tables, sampling, bucket)
    q = query_len
    return (padded(ids, PAD["input_ids"], q), padded(positions, PAD["positions"], q),
            padded(slots, PAD["slot_mapping"], q), padded(seq_lens, PAD["seq_lens"]),
            np.arange(bucket + 1, dtype=np.int32) * q, padded(sample_positions, PAD["sample_positions"]))



def _prepare_on_device(mirror: StateMirror, state: RequestStateRows, buffers: StepBuffers, rows: np.ndarray,
                       qlens: np.ndarray, starts: np.ndarray, ids: np.ndarray, qsl: np.ndarray,
                       seq_lens: np.ndarray, sample_positions: np.ndarray, bucket: int | None,
                       query_len: int) -> tuple[AttentionMetadata, np.ndarray, np.ndarray]:
    """The GPU-native path's metadata: the mirrors take this step's staged writes, then the input-prep
    kernel fills positions, slots, seq_lens, query_start_loc and block tables on the device. The host
    keeps only what it already knows for its own plans (query_start_loc and seq_lens from the query
    lengths; an eager step's block-table rows; a graph step's host mirrors). Returns (the metadata, the
    token ids and sample positions to write, padded for a graph step)."""
    max_query_len, max_seq_len = int(qlens.max()), int(seq_lens.max())
    idx_mapping, query_lens = mirror.stage(rows, qlens, starts)
    num_tokens, tables_cpu, pad_query_len = len(ids), None, 0
    if bucket is None:
        tables_cpu = torch.from_numpy(state.block_tables[rows, :cdiv(max_seq_len, buffers.block_size)])
    else:  # every request samples: the padding rows follow the batch's
        pad, pad_query_len = bucket - len(rows), query_len
        ids = np.concatenate((ids, np.full(pad * query_len, PAD["input_ids"], dtype=ids.dtype)))
        seq_lens = np.concatenate((seq_lens, np.full(pad, PAD["seq_lens"], dtype=seq_lens.dtype)))
        sample_positions = np.concatenate((sample_positions, np.full(pad, PAD["sample_positions"],
                                                                     dtype=sample_positions.dtype)))
        qsl, num_tokens = np.arange(bucket + 1, dtype=np.int32) * query_len, bucket * query_len
        tables, sampling = graph_rows(state, rows)
        buffers.put_graph_host_rows(tables, qsl, seq_lens, bucket)
        buffers.put_sampling_rows(sampling, bucket)
    meta = buffers.fill_on_device(mirror.kernel, idx_mapping, query_lens, mirror.num_computed,
                                  mirror.block_tables, num_tokens, qsl, seq_lens, max_query_len,
                                  max_seq_len, tables_cpu, pad_query_len)
    return meta, ids, sample_positions


def graph_rows(state: RequestStateRows, rows: np.ndarray, sampling: bool = True
               ) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
    """What a graph step reads from the state rows ``rows``, for ``StepBuffers.put_graph_rows``: their
    block-table rows at full width and (with ``sampling``) their temperatures, top-k, top-p and seeds."""
    params = None if not sampling else dict(temperatures=state.temperature[rows], top_k=state.top_k[rows],
                                            top_p=state.top_p[rows], seeds=state.seed[rows])
    return state.block_tables[rows], params


def _slots(state: RequestStateRows, block_size: int, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The slot of every token; rows: each token's state row."""
    return slot_of(state.block_tables, positions, block_size, rows)

"""ModelRunner: turns one scheduled step into tensors, runs the model over the paged KV cache, samples.

One step is five stages, each a method a notebook can call and inspect:
``prepare_inputs → run_model → compute_logits → sample → postprocess``.

Owns the KV cache tensors, the static per-step buffers (input_ids, positions, slot_mapping,
query_start_loc, seq_lens, block_tables), and the persistent per-request state rows
(minirunner/worker/states.py): a step writes only what changed (new block ids) and gathers the batch's rows.
Buffers are allocated once at their maximum size and every step writes into them, so a captured or
compiled decode step (worker/cudagraph.py) replays over the same storage. A decode batch of B requests
whose B has a bucket runs padded to that bucket: every row of it is written each step (padding rows: slot
-1, seq_len 0, token 0, greedy), so no step reads a stale tail. It never decides what to schedule.

The KV tensors hold one block more than the pool hands out: the null block (the last one), where padding
rows (slot -1) may write.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels._triton import HAS_TRITON
from kernels.sampling import sample, sample_ref
from minirunner.attention import AttentionMetadata
from minirunner.attention.base import AttentionBackend
from minirunner.engine.request import Request
from minirunner.engine.scheduler import ScheduledRequest, SchedulerOutput
from minirunner.kv.manager import KVCacheManager
from minirunner.logprobs import TokenLogprobs, score_prompts, score_tokens
from minirunner.model.decoder import DecoderLM
from minirunner.spec_decode.verify import verify_drafts
from minirunner.worker.cudagraph import DecodeGraphs
from minirunner.worker.logits_processing import (
    LogitsProcessors,
    apply_logits_processors,
    needs_logits_processing,
)
from minirunner.worker.runner_output import RunnerOutput, StepGraphInfo
from minirunner.worker.states import RequestStateRows


@dataclass(slots=True)
class StepInputs:
    """What ``prepare_inputs`` hands the later stages: views of the static buffers for this step.

    input_ids: int64 [num_tokens]; logits_indices: int64 [num_sampling + num_draft_tokens] (the flat
    rows whose logits are computed: for every request that samples, its last known token's row, then one
    row per speculative draft); sample_rows: the sampling requests' state rows (host); sample_positions:
    int64 [num_sampling] (position of the first token each samples); sample_requests: those requests, in
    order.
    """

    input_ids: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sample_rows: np.ndarray
    sample_positions: torch.Tensor
    sample_requests: list[Request]
    draft_token_ids: np.ndarray  # int64 [num_draft_tokens]: speculative drafts, request by request
    num_drafts: np.ndarray  # int64 [num_sampling]: drafts of each sampling request


class ModelRunner:
    def __init__(self, model: DecoderLM, backend: AttentionBackend, num_blocks: int,
                 block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        cfg = model.config
        self.model, self.backend = model, backend
        self.device, self.dtype = backend.device, backend.dtype
        self.block_size = block_size
        shape = (num_blocks + 1, 2, block_size, cfg.num_kv_heads, cfg.head_dim)  # + the null block
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(cfg.num_layers)]
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        T, S = max_num_batched_tokens, max_num_seqs
        self._host: dict[int, tuple[torch.Tensor, np.ndarray]] = {}
        self.state = RequestStateRows(2 * S, self.max_blocks_per_seq)
        self.input_ids = self._buffer(T, torch.int64)
        self.positions = self._buffer(T, torch.int64)
        self.slot_mapping = self._buffer(T, torch.int64, fill=-1)
        self.query_start_loc = self._buffer(S + 1, torch.int32)
        self.seq_lens = self._buffer(S, torch.int32)
        self.block_tables = self._buffer((S, self.max_blocks_per_seq), torch.int32)
        self.logits_indices = self._buffer(T, torch.int64)  # a speculative request scores k + 1 rows
        self.sample_positions = self._buffer(S, torch.int64)
        # Sampling parameters of a graph step's rows, read inside the replay.
        self.temperatures = self._buffer(S, torch.float32)
        self.top_k = self._buffer(S, torch.int64)
        self.top_p = self._buffer(S, torch.float32)
        self.seeds = self._buffer(S, torch.int64)
        self._static_meta: dict[int, AttentionMetadata] = {}
        self.graphs: DecodeGraphs | None = None
        self.logits_processors = LogitsProcessors(cfg.vocab_size, self.device)

    def enable_graphs(self, mode: str, sizes: list[int], max_draft_tokens: int = 0) -> DecodeGraphs:
        """Run decode batches that fit a bucket of ``sizes`` as one compiled ("compile") or captured
        ("cuda") step; under "cuda" every bucket's greedy step is captured now, largest first.
        ``max_draft_tokens`` > 0: uniform verify steps with up to that many drafts per request run as
        buckets too (compiled or captured on first use)."""
        self.graphs = DecodeGraphs(self, mode, sizes, max_draft_tokens)
        if mode == "cuda":
            self.graphs.capture(kind="greedy")
        return self.graphs

    @torch.inference_mode()
    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Copy whole KV blocks src[i] -> dst[i] in every layer's cache (copy-on-write of a shared
        block before its first write). src, dst: block ids, equal lengths."""
        if not src:
            return
        s = torch.tensor(src, dtype=torch.int64, device=self.device)
        d = torch.tensor(dst, dtype=torch.int64, device=self.device)
        for cache in self.kv_caches:
            cache[d] = cache[s]

    # -- buffers --------------------------------------------------------------------------------
    def _buffer(self, shape, dtype, fill: int = 0) -> torch.Tensor:
        buf = torch.full(shape if isinstance(shape, tuple) else (shape,), fill, dtype=dtype,
                         device=self.device)
        # The host side of the buffer: a pinned mirror on CUDA (copies then do not block the host), the
        # buffer itself on a CPU (no copy at all).
        host = torch.empty_like(buf, device="cpu").pin_memory() if buf.device.type == "cuda" else buf
        self._host[buf.data_ptr()] = (host, host.numpy())
        return buf

    def _put(self, buf: torch.Tensor, arr: np.ndarray) -> torch.Tensor:
        """Write a host array into the front of a static buffer; returns the view."""
        index = tuple(slice(0, n) for n in arr.shape)
        host, host_np = self._host[buf.data_ptr()]
        host_np[index] = arr
        if host is buf:
            return buf[index]
        view = buf[index]
        view.copy_(host[index], non_blocking=True)
        return view

    def static_meta(self, size: int, query_len: int = 1) -> AttentionMetadata:
        """The metadata a graph step of bucket ``size`` reads: views of the first ``size`` rows (and
        ``size * query_len`` token rows: 1 for decode, k + 1 for verify) of the static buffers (fixed
        storage), the block tables at their full width (a static shape)."""
        meta = self._static_meta.get((size, query_len))
        if meta is None:
            qsl, lens = self.query_start_loc[:size + 1], self.seq_lens[:size]
            tables, n = self.block_tables[:size], size * query_len
            meta = self._static_meta[(size, query_len)] = AttentionMetadata(
                positions=self.positions[:n], slot_mapping=self.slot_mapping[:n],
                query_start_loc=qsl, seq_lens=lens, block_tables=tables,
                query_start_loc_cpu=self._host[qsl.data_ptr()][0][:size + 1],
                seq_lens_cpu=self._host[lens.data_ptr()][0][:size],
                max_query_len=query_len, max_seq_len=self.max_blocks_per_seq * self.block_size,
                block_size=self.block_size,
                block_tables_cpu=self._host[tables.data_ptr()][0][:size])
        return meta

    def write_padding_rows(self, start: int, end: int, query_len: int = 1) -> None:
        """Rows [start, end) of the graph-step buffers become padding rows of ``query_len`` tokens each:
        token 0 at position 0, slot -1 (the null block), seq_len 0, block-table row 0, greedy;
        query_start_loc[: end + 1] = 0, q, 2q, ..."""
        n, q = end - start, query_len
        for buf, value in ((self.input_ids, 0), (self.positions, 0), (self.slot_mapping, -1)):
            self._put_rows(buf, start * q, np.full(n * q, value))
        for buf, value in ((self.seq_lens, 0), (self.temperatures, 0), (self.top_k, 0),
                           (self.top_p, 1), (self.seeds, 0), (self.sample_positions, 0)):
            self._put_rows(buf, start, np.full(n, value))
        self._put_rows(self.block_tables, start, np.zeros((n, self.max_blocks_per_seq), np.int32))
        self._put(self.query_start_loc, np.arange(end + 1, dtype=np.int32) * q)

    def _slots(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The slot formula (block_table[pos // B] * B + pos % B) for every token at once; rows: each
        token's state row."""
        B = self.block_size
        return self.state.block_tables[rows, positions // B].astype(np.int64) * B + positions % B

    def _put_meta(self, positions, slots, qsl, seq_lens, num_seqs: int, max_query_len: int,
                  max_seq_len: int, tables_cpu: torch.Tensor | None) -> AttentionMetadata:
        """Write a step's metadata arrays into their static buffers; the metadata of their views."""
        return AttentionMetadata(
            positions=self._put(self.positions, positions),
            slot_mapping=self._put(self.slot_mapping, slots),
            query_start_loc=self._put(self.query_start_loc, qsl),
            seq_lens=self._put(self.seq_lens, seq_lens),
            block_tables=self.block_tables[:num_seqs],
            query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens_cpu=torch.from_numpy(seq_lens),
            max_query_len=max_query_len, max_seq_len=max_seq_len, block_size=self.block_size,
            block_tables_cpu=tables_cpu)

    def _put_tables(self, rows: np.ndarray, max_seq_len: int) -> torch.Tensor:
        """Write an eager step's block-table rows (state rows ``rows``, only the columns its longest
        sequence reaches); returns their host copy, which the backends plan from without reading the
        device."""
        cols = -(-max_seq_len // self.block_size)
        self._put(self.block_tables, self.state.block_tables[rows, :cols])
        return self._host[self.block_tables.data_ptr()][0][:len(rows), :cols]

    def _put_rows(self, buf: torch.Tensor, start: int, arr: np.ndarray) -> None:
        """Write a host array into rows [start, start + len(arr)) of a static buffer."""
        host, host_np = self._host[buf.data_ptr()]
        end = start + len(arr)
        host_np[start:end] = arr
        if host is not buf:
            buf[start:end].copy_(host[start:end], non_blocking=True)

    def free_request(self, request_id: str) -> None:
        """Forget a finished, aborted or preempted request's state row."""
        self.state.release(request_id)

    # -- the five stages ------------------------------------------------------------------------
    def prepare_inputs(self, scheduled: list[ScheduledRequest], kv: KVCacheManager,
                       bucket: int | None = None, query_len: int = 1) -> StepInputs:
        """Fill the step buffers from the scheduler's decisions (host work, numpy, no device sync).

        ``bucket``: a uniform batch (every request ``query_len`` tokens: 1 for decode, k + 1 for a
        verify step) padded to this many rows for a graph step: rows past the batch become padding
        rows, block tables are written at their full width, and the sampling parameters go to their
        static buffers; the returned metadata describes the padded batch."""
        S = len(scheduled)
        state = self.state
        rows = np.empty(S, dtype=np.int64)
        qlens = np.empty(S, dtype=np.int64)
        starts = np.empty(S, dtype=np.int64)
        samples = np.empty(S, dtype=bool)
        num_drafts = np.zeros(S, dtype=np.int64)
        drafts: list[int] = []
        T = sum(s.num_new_tokens for s in scheduled)
        ids = np.empty(T, dtype=np.int64)
        t = 0
        for i, s in enumerate(scheduled):
            request, n = s.request, s.num_new_tokens
            start = request.num_computed_tokens
            rows[i] = state.sync(request, kv.table(request.request_id))
            known = min(n, request.num_tokens - start)
            ids[t:t + known] = request.token_buffer[start:start + known]
            if s.draft_token_ids:  # speculative tokens follow the known ones
                ids[t + known:t + n] = s.draft_token_ids
                num_drafts[i] = len(s.draft_token_ids)
                drafts += s.draft_token_ids
            qlens[i], starts[i], samples[i] = n, start, s.samples
            t += n
        qsl = np.zeros(S + 1, dtype=np.int32)
        np.cumsum(qlens, out=qsl[1:])
        positions = np.repeat(starts - qsl[:-1], qlens) + np.arange(T)
        slots = self._slots(np.repeat(rows, qlens), positions)
        seq_lens = (starts + qlens).astype(np.int32)
        max_seq_len = int(seq_lens.max())
        # logits_indices: each sampling request's last known token, then each of its drafts
        d = num_drafts[samples]
        width = d + 1
        logits_rows = np.repeat(qsl[1:][samples] - width, width) \
            + np.arange(int(width.sum())) - np.repeat(np.cumsum(width) - width, width)
        sample_positions = (seq_lens[samples] - d).astype(np.int64)  # of the first token sampled
        tables_cpu = None
        if bucket is None:
            tables_cpu = self._put_tables(rows, max_seq_len)
        else:  # every request samples: the padded rows follow the batch's
            ids, positions, slots, seq_lens, qsl, sample_positions = self._pad_uniform(
                ids, positions, slots, seq_lens, sample_positions, rows, bucket, query_len)
            S = bucket
        meta = self._put_meta(positions, slots, qsl, seq_lens, S, int(qlens.max()), max_seq_len,
                              tables_cpu)
        return StepInputs(
            input_ids=self._put(self.input_ids, ids),
            meta=meta,
            logits_indices=self._put(self.logits_indices, logits_rows),
            sample_rows=rows[samples],
            sample_positions=self._put(self.sample_positions, sample_positions),
            sample_requests=[s.request for s, flag in zip(scheduled, samples, strict=True) if flag],
            draft_token_ids=np.asarray(drafts, dtype=np.int64),
            num_drafts=d,
        )

    def prepare_next_decode(self, prev: StepInputs, tokens: torch.Tensor,
                            scheduled: list[ScheduledRequest], kv: KVCacheManager) -> StepInputs:
        """``prepare_inputs`` for the pass right after the eager pass ``prev`` in which every request of
        ``scheduled`` sampled, when each now feeds the one token it just sampled (``tokens``: int64
        [num_requests] on the device, e.g. the draft's argmax) and samples again: the draft proposer's
        passes 1..k-1. As vLLM's EAGLE proposer does, positions and seq_lens move on by one and the slots
        come from the block tables (new block ids written first); the tokens go device to device, never
        through the host, and the per-request bookkeeping of ``prepare_inputs`` is skipped."""
        state = self.state
        for s in scheduled:
            state.sync(s.request, kv.table(s.request.request_id))
        rows, n = prev.sample_rows, len(scheduled)
        positions = prev.meta.seq_lens_cpu.numpy().astype(np.int64)  # each new token's position
        seq_lens = (positions + 1).astype(np.int32)
        slots = self._slots(rows, positions)
        qsl = np.arange(n + 1, dtype=np.int32)
        max_seq_len = int(seq_lens.max())
        tables_cpu = self._put_tables(rows, max_seq_len)
        input_ids = self.input_ids[:n]
        input_ids.copy_(tokens)
        meta = self._put_meta(positions, slots, qsl, seq_lens, n, 1, max_seq_len, tables_cpu)
        return StepInputs(
            input_ids=input_ids, meta=meta,
            logits_indices=self._put(self.logits_indices, np.arange(n, dtype=np.int64)),
            sample_rows=rows,
            sample_positions=self._put(self.sample_positions, seq_lens.astype(np.int64)),
            sample_requests=prev.sample_requests,
            draft_token_ids=np.zeros(0, dtype=np.int64),
            num_drafts=np.zeros(n, dtype=np.int64))

    def _pad_uniform(self, ids, positions, slots, seq_lens, sample_positions, rows: np.ndarray,
                     bucket: int, query_len: int):
        """Pad a uniform batch's arrays to ``bucket`` rows (of ``query_len`` tokens each) and write the
        graph step's static buffers."""
        pad = bucket - len(rows)

        def padded(arr, value, per_row=1):
            return np.concatenate((arr, np.full(pad * per_row, value, dtype=arr.dtype)))

        for buf, arr in self.graph_rows(rows, bucket):
            self._put(buf, arr)
        q = query_len
        return (padded(ids, 0, q), padded(positions, 0, q), padded(slots, -1, q), padded(seq_lens, 0),
                np.arange(bucket + 1, dtype=np.int32) * q, padded(sample_positions, 0))

    def graph_rows(self, rows: np.ndarray, bucket: int, sampling: bool = True
                   ) -> list[tuple[torch.Tensor, np.ndarray]]:
        """What a graph step of ``bucket`` rows reads from the state rows ``rows`` (padding rows after
        them), as (static buffer, host array) pairs for the caller to write: the block tables at full
        width (a static shape; zeros for padding), and with ``sampling`` the temperatures (padding:
        0, greedy), top-k (0), top-p (1) and seeds (0)."""
        state, pad = self.state, bucket - len(rows)
        tables = np.zeros((bucket, self.max_blocks_per_seq), dtype=np.int32)
        tables[:len(rows)] = state.block_tables[rows]
        out = [(self.block_tables, tables)]
        if sampling:
            out += [(buf, np.concatenate((values[rows], np.full(pad, fill, dtype=values.dtype))))
                    for buf, values, fill in ((self.temperatures, state.temperature, 0),
                                              (self.top_k, state.top_k, 0), (self.top_p, state.top_p, 1),
                                              (self.seeds, state.seed, 0))]
        return out

    def graph_bucket(self, scheduled: list[ScheduledRequest]) -> tuple[int, int] | None:
        """(bucket, query_len) of the step this batch replays, or None (eager). Decode (query_len 1):
        every request samples one new token. Verify (query_len k + 1): every request scores its last
        known token and exactly k drafts, k the same for all. Either way the batch must fit a bucket,
        and its sampling need nothing the replay lacks (logit bias, min_tokens suppression, penalties,
        min_p and prompt logprobs are applied on the host's per-request state: such steps run eager)."""
        if self.graphs is None or not scheduled or not all(s.samples and _graph_ready(s.request)
                                                           for s in scheduled):
            return None
        k = len(scheduled[0].draft_token_ids)
        if not all(s.num_new_tokens == k + 1 and len(s.draft_token_ids) == k for s in scheduled):
            return None
        size = self.graphs.bucket(len(scheduled)) if k == 0 else \
            self.graphs.verify_bucket(len(scheduled), k)
        return None if size is None else (size, k + 1)

    def sampler_kind(self, rows: np.ndarray) -> str:
        """Which compiled sampler a graph step of these state rows needs: greedy, sample or filter."""
        state = self.state
        if not state.temperature[rows].any():
            return "greedy"
        top_k, vocab = state.top_k[rows], self.model.config.vocab_size
        if ((top_k > 0) & (top_k < vocab)).any() or (state.top_p[rows] < 1).any():
            return "filter"
        return "sample"

    def run_model(self, inputs: StepInputs) -> torch.Tensor:
        """The forward pass: every layer writes its K/V by slot and attends. Returns hidden states
        [num_tokens, hidden_size]."""
        self.backend.plan(inputs.meta)
        return self.model(inputs.input_ids, inputs.meta, self.kv_caches, self.backend)

    def compute_logits(self, hidden: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        """fp32 logits [num_sampling, vocab] for the rows that sample only."""
        if inputs.logits_indices.shape[0] == hidden.shape[0]:
            # every row samples: the indices (ascending, distinct, < num_tokens) are 0..n-1
            return self.model.compute_logits(hidden)
        return self.model.compute_logits(hidden[inputs.logits_indices])

    def sample(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        """One token per sampling request: int64 [num_sampling]. Logit bias, min_tokens, penalties and
        min_p apply first (only when some request asks for them); an all-greedy batch is then one argmax,
        and the top-k/top-p sort runs only when some request in the batch asks for it."""
        logits = apply_logits_processors(logits, self.logits_processors.prepare(inputs.sample_requests))
        state, rows = self.state, inputs.sample_rows
        temps = state.temperature[rows]
        if not temps.any():
            return logits.argmax(dim=-1)
        top_k, top_p = state.top_k[rows], state.top_p[rows]
        filters = bool(((top_k > 0) & (top_k < logits.shape[-1])).any() or (top_p < 1).any())
        dev = logits.device
        args = (logits, torch.from_numpy(temps).to(dev), torch.from_numpy(top_k).to(dev),
                torch.from_numpy(top_p).to(dev), torch.from_numpy(state.seed[rows]).to(dev),
                inputs.sample_positions)
        if dev.type == "cuda" and HAS_TRITON:
            return sample(*args, apply_filters=filters)
        return sample_ref(*args, apply_filters=filters)

    def postprocess(self, tokens: torch.Tensor) -> list[int]:
        """Sampled tokens back to the host for the engine (the step's one device-to-host sync)."""
        return tokens.tolist()

    @torch.inference_mode()
    def forward_logits(self, scheduled: list[ScheduledRequest], kv: KVCacheManager,
                       after: tuple[StepInputs, torch.Tensor] | None = None):
        """prepare_inputs -> run_model -> compute_logits with no sampling: (the fp32 logits of the rows
        that sample, or None; the step's inputs, None for a graph step). The draft proposer samples its
        tokens itself. A decode batch that fits a bucket replays its greedy graph step (its argmax is not
        used). ``after``: (the inputs of the previous eager pass, the tokens it sampled) when this pass
        feeds exactly those tokens (:meth:`prepare_next_decode`)."""
        graph = self.graph_bucket(scheduled)
        if graph is not None and graph[1] == 1:
            self.prepare_inputs(scheduled, kv, graph[0])
            return self._replay(graph[0], "greedy", len(scheduled))[1], None
        inputs = self.prepare_inputs(scheduled, kv) if after is None else \
            self.prepare_next_decode(*after, scheduled, kv)
        hidden = self.run_model(inputs)
        return (self.compute_logits(hidden, inputs) if len(inputs.sample_rows) else None), inputs

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput, kv: KVCacheManager,
                draft_probs: torch.Tensor | None = None) -> RunnerOutput:
        """Run one step: prepare inputs, run the model (or replay a bucket), sample. Returns the step's
        RunnerOutput (nothing is kept on the runner). draft_probs: fp32 [num_draft_tokens, vocab], the
        draft model's q of every draft token in order, or None (no drafts, or one-hot n-gram drafts)."""
        scheduled = scheduler_output.scheduled
        graph = self.graph_bucket(scheduled)
        bucket, query_len = graph if graph is not None else (None, 1)
        inputs = self.prepare_inputs(scheduled, kv, bucket, query_len)
        out = RunnerOutput(req_ids=[r.request_id for r in inputs.sample_requests],
                           num_drafts=inputs.num_drafts.tolist())
        if bucket is not None and query_len > 1:
            out.runs, out.logits, out.graph = self._replay_verify(bucket, query_len, inputs, draft_probs)
            return out
        if bucket is not None:
            tokens, out.logits, out.graph = self._replay(bucket, self.sampler_kind(inputs.sample_rows),
                                                         len(scheduled))
            out.logprobs = self._score_logprobs(out.logits, tokens, inputs)
            out.runs = [[t] for t in self.postprocess(tokens)]
            return out
        hidden = self.run_model(inputs)
        out.prompt_logprobs = score_prompts(self.model, hidden, scheduled)
        if not len(inputs.sample_rows):
            return out
        out.logits = self.compute_logits(hidden, inputs)
        if len(inputs.draft_token_ids):
            state, rows = self.state, inputs.sample_rows
            out.runs = verify_drafts(out.logits, inputs, draft_probs, state.temperature[rows],
                                     state.top_k[rows], state.top_p[rows], state.seed[rows])
            return out
        tokens = self.sample(out.logits, inputs)
        self.logits_processors.record(tokens)
        out.logprobs = self._score_logprobs(out.logits, tokens, inputs)
        out.runs = [[t] for t in self.postprocess(tokens)]
        return out

    def _replay(self, bucket: int, kind: str, n: int, query_len: int = 1):
        """Replay bucket ``bucket``'s step of ``kind`` for a batch of ``n`` requests: (its first n rows
        of tokens or runs, the logits of their n * query_len token rows, copied out: the next replay
        overwrites its outputs; how the step ran)."""
        out, logits = self.graphs.run(bucket, kind, query_len)
        return out[:n], logits[:n * query_len].clone(), StepGraphInfo(self.graphs.mode, bucket, bucket - n)

    def _replay_verify(self, bucket: int, query_len: int, inputs: StepInputs,
                       draft_probs: torch.Tensor | None):
        """A uniform verify step as one replay: the drafts' q goes to the static buffer, the graph runs
        the target over every row's k + 1 tokens and the rejection sampler, and the emitted runs come
        back in the step's one device-to-host copy (as a decode step's tokens do). Returns (runs,
        logits, how the step ran)."""
        n, k = len(inputs.sample_requests), query_len - 1
        if draft_probs is not None:
            self.graphs.draft_probs_buffer()[:n * k].copy_(draft_probs)
        kind = "verify" if draft_probs is not None else "verify_onehot"
        runs, logits, info = self._replay(bucket, kind, n, query_len)
        return [[t for t in row if t >= 0] for row in self.postprocess(runs)], logits, info

    @staticmethod
    def _score_logprobs(logits: torch.Tensor, tokens: torch.Tensor, inputs: StepInputs
                        ) -> TokenLogprobs | None:
        k = max((r.params.logprobs for r in inputs.sample_requests if r.params.logprobs is not None),
                default=None)
        return None if k is None else score_tokens(logits, tokens, k)


def _graph_ready(request: Request) -> bool:
    """Whether a request's next token can be sampled inside a graph step (temperature, top-k, top-p and
    the seed are static buffers there; the logits processors' per-request state is not)."""
    return not (needs_logits_processing(request) or request.params.prompt_logprobs is not None)

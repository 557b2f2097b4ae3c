"""ModelRunner: turns one scheduled step into tensors, runs the model over the paged KV cache, samples.

Owns the KV cache tensors, the preallocated per-step input buffers (input_ids, positions, slot_mapping,
query_start_loc, seq_lens, block_tables) and the model. It never decides what to schedule. Buffers are
allocated once at their maximum size and every step writes into them, so a later CUDA-graph capture can
reuse the same storage.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kernels._triton import HAS_TRITON
from kernels.rejection_sampling import rejection_sample, rejection_sample_ref
from kernels.sampling import sample, sample_ref
from minirunner.attention import AttentionMetadata
from minirunner.attention.base import AttentionBackend
from minirunner.kv.manager import KVCacheManager
from minirunner.model.decoder import DecoderLM
from minirunner.scheduler import ScheduledRequest

_SEED_MASK = (1 << 63) - 1


class ModelRunner:
    def __init__(self, model: DecoderLM, backend: AttentionBackend, num_blocks: int,
                 block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        cfg = model.config
        self.model, self.backend = model, backend
        self.device, self.dtype = backend.device, backend.dtype
        self.block_size = block_size
        shape = (num_blocks, 2, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(cfg.num_layers)]
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        dev, T, S = self.device, max_num_batched_tokens, max_num_seqs
        self.input_ids = torch.zeros(T, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(T, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((T,), -1, dtype=torch.int64, device=dev)
        self.query_start_loc = torch.zeros(S + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(S, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(S, self.max_blocks_per_seq, dtype=torch.int32, device=dev)

    def prepare(self, scheduled: list[ScheduledRequest], kv: KVCacheManager):
        """Fill the step buffers; returns (input_ids, metadata) views for this step."""
        S = len(scheduled)
        qlens = np.array([s.num_new_tokens for s in scheduled], dtype=np.int64)
        starts = np.array([s.request.num_computed_tokens for s in scheduled], dtype=np.int64)
        qsl = np.zeros(S + 1, dtype=np.int32)
        np.cumsum(qlens, out=qsl[1:])
        T = int(qsl[-1])
        ids = np.empty(T, dtype=np.int64)
        slots = np.empty(T, dtype=np.int64)
        tables = np.zeros((S, self.max_blocks_per_seq), dtype=np.int32)
        for i, s in enumerate(scheduled):
            lo, hi, start = qsl[i], qsl[i + 1], starts[i]
            known = s.request.all_token_ids + s.draft_token_ids if s.draft_token_ids \
                else s.request.all_token_ids
            ids[lo:hi] = known[start:start + qlens[i]]
            table = kv.table(s.request.request_id)
            slots[lo:hi] = table.slots(start, start + qlens[i])
            tables[i, :len(table)] = table.blocks
        # positions = start of each sequence + offset within its query
        positions = np.repeat(starts - qsl[:-1], qlens) + np.arange(T)
        seq_lens = (starts + qlens).astype(np.int32)

        def put(buf, arr):
            view = buf[:len(arr)]
            view.copy_(torch.from_numpy(arr), non_blocking=True)
            return view

        meta = AttentionMetadata(
            positions=put(self.positions, positions),
            slot_mapping=put(self.slot_mapping, slots),
            query_start_loc=put(self.query_start_loc, qsl),
            seq_lens=put(self.seq_lens, seq_lens),
            block_tables=self.block_tables[:S],
            query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens_cpu=torch.from_numpy(seq_lens),
            max_query_len=int(qlens.max()),
            max_seq_len=int(seq_lens.max()),
            block_size=self.block_size,
        )
        self.block_tables[:S].copy_(torch.from_numpy(tables), non_blocking=True)
        return put(self.input_ids, ids), meta

    @torch.inference_mode()
    def forward_logits(self, scheduled: list[ScheduledRequest], kv: KVCacheManager):
        """Run the model over one step; returns fp32 logits [n, vocab] of the rows that sample (the
        last 1 + len(draft_token_ids) query rows of each request whose step ``samples``), or None."""
        input_ids, meta = self.prepare(scheduled, kv)
        self.backend.plan(meta)
        hidden = self.model(input_ids, meta, self.kv_caches, self.backend)
        ends = meta.query_start_loc_cpu[1:].tolist()
        # logits_indices: a spec request scores its last verified token and each of its drafts
        rows = [row for i, s in enumerate(scheduled) if s.samples
                for row in range(ends[i] - 1 - len(s.draft_token_ids), ends[i])]
        if not rows:
            return None
        return self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest], kv: KVCacheManager,
                draft_probs: torch.Tensor | None = None):
        """Run one step. Returns (the tokens emitted by each request whose step ``samples``, in order:
        one each, or the accepted run of a speculative request; their fp32 logits [rows, vocab]).
        draft_probs: fp32 [num_draft_tokens, vocab], the draft model's q for every draft token in
        order, or None (no drafts, or one-hot n-gram drafts)."""
        logits = self.forward_logits(scheduled, kv)
        if logits is None:
            return [], None
        sampling = [s for s in scheduled if s.samples]
        if any(s.draft_token_ids for s in sampling):
            return self.sample_spec(logits, sampling, draft_probs), logits
        reqs = [s.request for s in sampling]
        dev = self.device
        if dev.type == "cuda" and HAS_TRITON:  # one fused pass; top-k/top-p known from the host
            filters = any(0 < r.params.top_k < logits.shape[-1] or r.params.top_p < 1 for r in reqs)
            sampler = functools.partial(sample, apply_filters=filters)
        else:
            sampler = sample_ref
        tokens = sampler(logits, *self._sampling_tensors(reqs))
        return [[t] for t in tokens.tolist()], logits

    def _sampling_tensors(self, reqs):
        """(temperatures, top_k, top_p, seeds, positions of the next token) for these requests."""
        dev = self.device
        return (
            torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32, device=dev),
            torch.tensor([r.params.top_k for r in reqs], dtype=torch.int64, device=dev),
            torch.tensor([r.params.top_p for r in reqs], dtype=torch.float32, device=dev),
            torch.tensor([r.seed & _SEED_MASK for r in reqs], dtype=torch.int64, device=dev),
            torch.tensor([r.num_tokens for r in reqs], dtype=torch.int64, device=dev),
        )

    def sample_spec(self, logits: torch.Tensor, sampling: list[ScheduledRequest],
                    draft_probs: torch.Tensor | None) -> list[list[int]]:
        """Verify the drafts of a step with the rejection sampler; returns each request's emitted run
        (its accepted drafts, then the target's own token). logits: fp32 [num_drafts + len(sampling),
        vocab], laid out as ``forward_logits`` returns them."""
        dev = self.device
        drafts = [t for s in sampling for t in s.draft_token_ids]
        cu = np.cumsum([len(s.draft_token_ids) for s in sampling])
        sampler = rejection_sample if dev.type == "cuda" and HAS_TRITON else rejection_sample_ref
        out = sampler(torch.tensor(drafts, dtype=torch.int64, device=dev),
                      torch.from_numpy(cu).to(dev), draft_probs, logits,
                      *self._sampling_tensors([s.request for s in sampling]))
        return [[t for t in row if t >= 0] for row in out.tolist()]

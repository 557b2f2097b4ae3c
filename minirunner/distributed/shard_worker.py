"""One rank's share of a tensor-parallel model: its weights, its KV heads, and one step over them.

Owns :class:`StepBatch`, what the driver sends every rank per step (the host arrays the driver's input
preparation computed: token ids, positions, slots, query starts, sequence lengths, block tables, the rows
whose logits are wanted), and :class:`ShardWorker`, which each rank builds (the driver in-process, each
worker in its own process) and which runs that batch through its shard. Every rank runs the same forward
in lockstep: the collectives inside the model pair them up. The block tables are the same on every rank
(one KV pool, bookkept by the driver); each rank's cache holds only its KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minirunner.attention import AttentionMetadata, backend_for
from minirunner.config import ModelConfig, parse_dtype
from minirunner.distributed.group import TPContext
from minirunner.model import batch_invariant as batch_invariant_mode
from minirunner.model.decoder import DecoderLM
from minirunner.model.loader import load_model
from minirunner.model.tensor_parallel import load_sharded_model
from minirunner.worker.model_runner import allocate_kv_caches


@dataclass
class StepBatch:
    """One step's flat batch, as host arrays (picklable; a few kilobytes).

    input_ids, positions, slot_mapping: int64 [num_tokens]; query_start_loc: int32 [num_seqs + 1];
    seq_lens: int32 [num_seqs]; block_tables: int32 [num_seqs, blocks]; logits_indices: int64 [rows]
    (the token rows whose logits are computed)."""

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    logits_indices: np.ndarray

    @classmethod
    def of_inputs(cls, inputs) -> StepBatch:
        """The host arrays of a driver's eager ``InputBatch`` (worker/input_batch.py)."""
        meta = inputs.meta
        host = lambda t: t.cpu().numpy()  # noqa: E731 - a copy on CUDA; a view on a CPU (pickled at once)
        return cls(host(inputs.input_ids), host(meta.positions), host(meta.slot_mapping),
                   meta.query_start_loc_cpu.numpy(), meta.seq_lens_cpu.numpy(),
                   meta.block_tables_cpu.numpy(), host(inputs.logits_indices))

    def metadata(self, device: torch.device, block_size: int) -> AttentionMetadata:
        qsl = torch.from_numpy(np.asarray(self.query_start_loc, dtype=np.int32))
        sl = torch.from_numpy(np.asarray(self.seq_lens, dtype=np.int32))
        tables = torch.from_numpy(np.asarray(self.block_tables, dtype=np.int32))
        return AttentionMetadata(
            positions=torch.from_numpy(np.asarray(self.positions, dtype=np.int64)).to(device),
            slot_mapping=torch.from_numpy(np.asarray(self.slot_mapping, dtype=np.int64)).to(device),
            query_start_loc=qsl.to(device), seq_lens=sl.to(device), block_tables=tables.to(device),
            query_start_loc_cpu=qsl, seq_lens_cpu=sl, max_query_len=int(np.diff(qsl.numpy()).max()),
            max_seq_len=int(sl.max()), block_size=block_size, block_tables_cpu=tables)


def load_shard(tp: TPContext, model_dir: str, dtype, device) -> DecoderLM:
    """Rank ``tp.rank``'s model: today's unsharded model for one device, else its shard."""
    full = ModelConfig.from_dir(model_dir)
    if tp.world_size == 1:  # one device: today's model, no collective anywhere
        return load_model(model_dir, full, parse_dtype(dtype), torch.device(device))
    return load_sharded_model(model_dir, full, parse_dtype(dtype), torch.device(device), tp)


def rank_device(tp: TPContext, device: str | torch.device) -> torch.device:
    """The device rank ``tp.rank`` runs on: cuda:rank on CUDA, else ``device``."""
    return torch.device(f"cuda:{tp.rank}") if torch.device(device).type == "cuda" else torch.device(device)


def build_rank(tp: TPContext, model_dir: str, dtype, num_blocks: int, block_size: int,
               attention_backend: str = "torch", device: str = "cpu", num_threads: int | None = None,
               batch_invariant: bool = False):
    """The engine's factory for ``WorkerGroup``: rank 0 (the driver) gets its shard model only (its
    ModelRunner owns the KV cache and samples); every other rank a :class:`ShardWorker`."""
    if tp.rank == 0:
        return load_shard(tp, model_dir, dtype, rank_device(tp, device))
    return ShardWorker(tp, model_dir, dtype, num_blocks, block_size, attention_backend, device, num_threads,
                       batch_invariant)


class ShardWorker:
    """Rank ``tp.rank``'s model shard, attention backend and KV cache (``num_blocks`` + the null block).

    Built by ``WorkerGroup(N, device, ShardWorker, (model_dir, dtype, num_blocks, block_size))``. Under
    the engine a worker's step is ``forward`` then one ``logits`` per logits computation of the driver's
    step (the same collectives in the same order); ``execute`` is both at once."""

    def __init__(self, tp: TPContext, model_dir: str, dtype, num_blocks: int, block_size: int,
                 attention_backend: str = "torch", device: str = "cpu", num_threads: int | None = None,
                 batch_invariant: bool = False):
        self.tp = tp
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.device = rank_device(tp, device)
        self.dtype = parse_dtype(dtype)
        self.model = load_shard(tp, model_dir, dtype, self.device)
        cfg = self.model.config  # this rank's heads
        self.block_size = block_size
        if batch_invariant:
            batch_invariant_mode.apply(self.model)
        self.backend = backend_for(attention_backend, cfg, block_size, self.device, self.dtype,
                                   batch_invariant)
        self.kv_caches = allocate_kv_caches(cfg, num_blocks, block_size, self.dtype, self.device)
        self.hidden: torch.Tensor | None = None  # the last forward's final hidden states

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> None:
        """The step's forward over this rank's shard (its K/V written to its cache); keeps the hidden
        states for the ``logits`` calls that follow."""
        meta = batch.metadata(self.device, self.block_size)
        self.backend.plan(meta)
        ids = torch.from_numpy(np.asarray(batch.input_ids, dtype=np.int64)).to(self.device)
        self.hidden = self.model(ids, meta, self.kv_caches, self.backend)

    @torch.inference_mode()
    def logits(self, rows: np.ndarray | None) -> None:
        """Join the driver's logits all-gather over rows ``rows`` of the last forward (None: all)."""
        hidden = self.hidden
        if rows is not None:
            hidden = hidden[torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)]
        self.model.compute_logits(hidden)

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> torch.Tensor | None:
        """Run one step; rank 0 returns the fp32 logits [rows, vocab] of ``batch.logits_indices``
        (host copy), the other ranks None (they hold the same logits; only rank 0 samples)."""
        meta = batch.metadata(self.device, self.block_size)
        self.backend.plan(meta)
        ids = torch.from_numpy(np.asarray(batch.input_ids, dtype=np.int64)).to(self.device)
        hidden = self.model(ids, meta, self.kv_caches, self.backend)
        rows = torch.from_numpy(np.asarray(batch.logits_indices, dtype=np.int64)).to(self.device)
        logits = self.model.compute_logits(hidden[rows])
        return logits.cpu() if self.tp.rank == 0 else None

    @torch.inference_mode()
    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Copy KV blocks src[i] -> dst[i] in this rank's caches (copy-on-write of a shared block)."""
        s, d = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        for cache in self.kv_caches:
            cache[d] = cache[s]

    def kv_heads(self) -> int:
        """How many KV heads this rank's cache holds."""
        return self.model.config.num_kv_heads

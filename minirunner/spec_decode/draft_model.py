"""DraftModel: the draft model as a worker component — its weights, its KV layers over the target's
block ids, its graphs over the target's step buffers, and each request's drafts in device rows.

Owns the draft's model, attention backend and KV cache tensors: as many blocks as the target's, of the
same size, so a target block id indexes both caches (the engine's one KV budget pays for both,
engine/build.py). Owns the draft's compiled or captured passes: a CudaGraphManager over the target's
StepBuffers, so a draft pass after a graph step reads the block tables that step wrote. Owns the drafts
proposed after each step, in device rows indexed by the worker's state rows (``DraftRows``).

It has no allocator, scheduler, runner or host copy of any request. The draft runs over exactly the
tokens the target ran each step, at the same slots (spec_decode/draft_passes.py). Its cache therefore
holds what the target's holds: preemption, prefix-cache hits and copy-on-write carry over, and a
request's rows are freed with the target's (the worker's rows are its rows).
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.attention import make_backend
from minirunner.config import EngineConfig, ModelConfig
from minirunner.core.host_copy import to_device
from minirunner.model.loader import load_model
from minirunner.worker.cudagraph import CudaGraphManager, capture_sizes
from minirunner.worker.model_runner import allocate_kv_caches


class DraftRows:
    """Each request's last proposal on the device, by worker state row: ``tokens`` int64 [rows, max k]
    (its drafts), ``start`` int64 [rows] (the position of the last verified token they follow) and
    ``last`` int64 [rows] (that token). A row is the request's as long as the worker's state row is."""

    def __init__(self, capacity: int, max_k: int, device: torch.device):
        self.device, self.max_k = device, max_k
        self.tokens = torch.zeros(capacity, max(max_k, 1), dtype=torch.int64, device=device)
        self.start = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.last = torch.zeros(capacity, dtype=torch.int64, device=device)

    def write(self, rows: np.ndarray, start: torch.Tensor, last: torch.Tensor, tokens: torch.Tensor) -> None:
        """Rows ``rows`` (host, the worker's state rows) take a step's proposals (device ops only)."""
        if int(rows.max()) >= self.start.shape[0]:  # the worker's rows grew (they double)
            self._grow(2 * int(rows.max()) + 2)
        index = to_device(rows.astype(np.int64), self.device)
        self.start.index_copy_(0, index, start)
        self.last.index_copy_(0, index, last)
        self.tokens[:, :tokens.shape[1]].index_copy_(0, index, tokens)

    def _grow(self, capacity: int) -> None:
        for name in ("tokens", "start", "last"):
            old = getattr(self, name)
            new = torch.zeros((capacity, *old.shape[1:]), dtype=old.dtype, device=self.device)
            new[:old.shape[0]] = old
            setattr(self, name, new)


class DraftModel:
    """The draft model's parts. ``num_blocks`` and the config's block size are the target's: the KV
    tensors hold num_blocks + 1 blocks (the null block where padding rows write), as the target's do.
    ``max_k``: the most drafts a step proposes. Proposes on the device (the worker's drafter runs its
    passes after each step); ``attach`` binds it to the target's buffers and builds its graphs."""

    proposes_on_device = True

    def __init__(self, draft_dir: str, config: EngineConfig, num_blocks: int, max_k: int):
        self.model_config = mc = ModelConfig.from_dir(draft_dir)
        self.model = load_model(draft_dir, mc, config.dtype, config.device)
        self.backend = make_backend(config, mc)
        self.kv_caches = allocate_kv_caches(mc, num_blocks, config.block_size, self.backend.dtype,
                                            self.backend.device)
        self.device, self.block_size = self.backend.device, config.block_size
        self.max_model_len, self.max_k = config.max_model_len, max_k
        self.graph_mode = config.graph_mode
        self.sizes = capture_sizes(config.max_num_seqs, config.cudagraph_capture_sizes)
        self.graphs: CudaGraphManager | None = None
        self.rows = DraftRows(2 * config.max_num_seqs, max_k, self.device)

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def attach(self, buffers) -> None:
        """Run the draft's uniform passes as graph steps over ``buffers`` (the target's StepBuffers):
        one token a row (the passes after the first), and the first pass's 2 .. max_k + 2 tokens a row
        (a graph step's query, plus the token it sampled). Under "cuda" every key is captured now."""
        if self.graph_mode == "none":
            return
        self.graphs = CudaGraphManager(buffers, self.model, self.backend, self.kv_caches, self.graph_mode,
                                       self.sizes, extra_query_lens=tuple(range(2, self.max_k + 3)))
        if self.graph_mode == "cuda":
            self.graphs.capture_all()

    def forward(self, input_ids: torch.Tensor, meta) -> torch.Tensor:
        """An eager draft pass over ``meta`` (host-planned): hidden states [num_tokens, hidden]."""
        self.backend.plan(meta)
        forward = self.model if self.graphs is None else self.graphs.eager_forward
        return forward(input_ids, meta, self.kv_caches, self.backend)

    def free(self, request_id: str) -> None:
        """Nothing to free: the draft's K/V lives in the target's blocks and its drafts in the worker's
        rows, both released with the target's."""

"""Per-step attention metadata: the explicit data every attention layer of one forward pass reads.

Owns the shape contract between the runner (which fills it) and the backends (which read it). It is
passed down the forward call explicitly; there is no global context. The runner fills preallocated
buffers and hands out views of them, so a later CUDA-graph capture can keep the same storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Metadata of one flat batch of query tokens (prefill chunks and decode tokens mixed).

    Device tensors (on the model's device):
      positions: int64 [num_tokens], the position of each query token in its sequence.
      slot_mapping: int64 [num_tokens], where its K/V goes: block * block_size + offset (-1 = skip).
      query_start_loc: int32 [num_seqs + 1], query rows of sequence i are [qsl[i], qsl[i+1]).
      seq_lens: int32 [num_seqs], tokens of sequence i including this step's queries (0 = padding row).
      block_tables: int32 [num_seqs, max_blocks_per_seq], physical block of each logical block.
    Host copies (CPU int32) of query_start_loc and seq_lens, for plan()-style backends that must not sync;
    block_tables_cpu, the host copy of block_tables (an eager step's: only the columns its longest sequence
    reaches), for the same backends; None where a caller built the metadata without it.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    max_query_len: int
    max_seq_len: int
    block_size: int
    block_tables_cpu: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @property
    def is_decode_only(self) -> bool:
        """Every sequence has exactly one query token (uniform decode: the CUDA-graph case)."""
        return self.max_query_len == 1 and self.num_tokens == self.num_seqs

"""Test helper: AttentionMetadata for a hand-described batch, built the slow obvious way (per token)."""

from __future__ import annotations

import torch

from minirunner.attention import AttentionMetadata


def make_meta(seq_lens, query_lens, block_tables, block_size, host_tables: bool = True) -> AttentionMetadata:
    """seq_lens / query_lens: per-sequence lists; block_tables: int32 [num_seqs, max_blocks] on the
    batch's device. A sequence with seq_len 0 is a padding row: its query tokens write to slot -1.
    host_tables: give the host copy of the block tables, as the runner does (False: the backends must
    manage without it)."""
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    positions, slots = [], []
    for i, (s, n) in enumerate(zip(seq_lens, query_lens, strict=True)):
        if s == 0:  # a padding row (CUDA-graph padding): its tokens write nowhere
            positions += [0] * n
            slots += [-1] * n
            continue
        for p in range(s - n, s):
            positions.append(p)
            slots.append(int(block_tables[i, p // block_size]) * block_size + p % block_size)
    dev = block_tables.device
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    return AttentionMetadata(
        positions=torch.tensor(positions, dtype=torch.int64, device=dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        query_start_loc=qsl_t.to(dev), seq_lens=sl.to(dev), block_tables=block_tables,
        query_start_loc_cpu=qsl_t.clone(), seq_lens_cpu=sl.clone(), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_size=block_size,
        block_tables_cpu=block_tables.cpu().clone() if host_tables else None)

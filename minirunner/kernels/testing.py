"""Random paged-KV batches for tests, benchmarks and notebooks (not used on the serving path).

Owns building a KV cache whose blocks are scattered in a random order, with block tables, ragged
query lengths and padding rows, exactly as the runner would lay them out. It never runs attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    """q: [num_tokens, H_q, D]; kv_cache: [num_blocks, 2, block_size, H_kv, D];
    block_tables: int32 [num_seqs, max_blocks]; seq_lens: int32 [num_seqs];
    query_start_loc: int32 [num_seqs + 1]. Padding rows have seq_len 0 and no queries."""

    q: torch.Tensor
    kv_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor


def random_paged_batch(
    seq_lens: list[int],
    query_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedBatch:
    """A batch whose sequence i holds seq_lens[i] tokens (the last query_lens[i] of them are this
    step's queries) in randomly permuted physical blocks; unused table entries are 0."""
    if len(seq_lens) != len(query_lens):
        raise ValueError("seq_lens and query_lens need one entry per sequence")
    if any(q > s for s, q in zip(seq_lens, query_lens, strict=True)):
        raise ValueError("a sequence cannot have more queries than tokens")
    gen = torch.Generator().manual_seed(seed)
    pages = [(s + block_size - 1) // block_size for s in seq_lens]
    num_blocks = sum(pages) + spare_blocks
    kv_cache = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.zeros(len(seq_lens), max(max(pages, default=0), 1), dtype=torch.int32)
    for i, n in enumerate(pages):
        block_tables[i, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    q = torch.randn(qsl[-1], num_q_heads, head_dim, generator=gen)
    return PagedBatch(
        q=q.to(device=device, dtype=dtype),
        kv_cache=kv_cache.to(device=device, dtype=dtype),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
    )

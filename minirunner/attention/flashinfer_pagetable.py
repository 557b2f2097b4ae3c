"""Our block tables + seq_lens as FlashInfer's CSR page table (pure torch, runs anywhere).

Owns the translation only: ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` (all int32) from
``block_tables: [num_seqs, max_blocks_per_seq]`` and ``seq_lens``. It never allocates blocks.
"""

from __future__ import annotations

import torch


def block_tables_to_csr(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's paged-KV page table for our sequences.

    block_tables: int [num_seqs, max_blocks_per_seq]; seq_lens: int [num_seqs] (0 = padding row).
    Returns on block_tables' device:
      kv_indptr int32 [num_seqs + 1]: sequence i's pages are kv_indices[indptr[i]:indptr[i+1]];
      kv_indices int32 [indptr[-1]]: physical page (block) ids, sequence by sequence, in order;
      kv_last_page_len int32 [num_seqs]: tokens in each sequence's last page, 1..page_size, so that
        seq_len = page_size * (num_pages - 1) + last_page_len. A padding row has no pages and
        last_page_len 1 (FlashInfer requires >= 1; the row's output is meaningless).
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    seq_lens = seq_lens.to(device=block_tables.device, dtype=torch.int64)
    num_pages = (seq_lens + page_size - 1) // page_size
    if block_tables.shape[0] and int(num_pages.max()) > block_tables.shape[1]:
        raise ValueError("a sequence needs more pages than its block table row holds")
    indptr = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=block_tables.device)
    indptr[1:] = num_pages.cumsum(0).to(torch.int32)
    cols = torch.arange(block_tables.shape[1], device=block_tables.device)
    used = cols[None, :] < num_pages[:, None]
    indices = block_tables[used].to(torch.int32)  # row-major: sequence by sequence, in page order
    last = torch.where(num_pages > 0, seq_lens - (num_pages - 1) * page_size,
                       torch.ones_like(seq_lens))
    return indptr, indices, last.to(torch.int32)

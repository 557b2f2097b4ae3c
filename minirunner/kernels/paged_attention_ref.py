"""Paged attention's torch twins: decode and prefill/extend over a block-table KV cache, written as
plain per-sequence loops (the readable reference the Triton kernels of ``paged_attention`` and the
vectorised torch backend are tested against).

Owns the math of attention over ``kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_dim]``
(K at ``[:, 0]``, V at ``[:, 1]``). It never allocates KV blocks or decides which slots a request owns.
"""

from __future__ import annotations

import torch


def _gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int):
    """K and V of one sequence, gathered through its block table: two ``[seq_len, H_kv, D]``."""
    block_size = kv_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    k = kv_cache[blocks, 0].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    v = kv_cache[blocks, 1].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    return k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int, scale: float):
    """Causal attention of ``q: [n, H_q, D]`` (positions context_len..context_len+n-1) over
    ``k, v: [context_len + n, H_kv, D]``; GQA by repeating KV heads. Computed in fp32."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    n, total = q.shape[0], k.shape[0]
    q_pos = torch.arange(n, device=q.device)[:, None] + context_len
    k_pos = torch.arange(total, device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def paged_decode_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode attention: one query token per sequence over its paged KV.

    q: [num_seqs, num_q_heads, head_dim]; kv_cache: [num_blocks, 2, block_size, num_kv_heads,
    head_dim]; block_tables: int32 [num_seqs, max_blocks_per_seq]; seq_lens: int32 [num_seqs], the
    length including the current token (0 marks a padding row, whose output is zeros).
    Returns [num_seqs, num_q_heads, head_dim].
    """
    out = torch.zeros_like(q)
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        k, v = _gather_kv(kv_cache, block_tables[i], seq_len)
        out[i] = _attend(q[i : i + 1], k, v, seq_len - 1, scale)[0]
    return out


def paged_prefill_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Prefill/extend attention: ragged queries per sequence, causal over cached prefix + new tokens.

    q: [num_tokens, num_q_heads, head_dim], the queries of sequence i are rows
    ``query_start_loc[i]:query_start_loc[i+1]`` (int32 [num_seqs + 1]) and sit at the last positions of its
    ``seq_lens[i]`` tokens (int32 [num_seqs]); their K/V must already be in ``kv_cache``. Rows of padding
    sequences (query length 0) are skipped. Returns [num_tokens, num_q_heads, head_dim].
    """
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo or seq_len == 0:
            continue
        k, v = _gather_kv(kv_cache, block_tables[i], seq_len)
        out[lo:hi] = _attend(q[lo:hi], k, v, seq_len - (hi - lo), scale)
    return out

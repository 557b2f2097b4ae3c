"""The torch attention backend's batched operations: K/V written by slot, blocks gathered through block
tables, and one scaled-dot-product attention over a padded batch (decode, or prefill/extend).

Owns the tensor math only, over indices the backend planned (attention/torch_backend.py); no host sync,
no Python loop over sequences. Padding rows (slot -1) write the cache's last block (the null block). A
compiled CPU decode step attends through the C kernel (kernels/paged_decode_cpu.py) as the operator
``minirunner::paged_decode_cpu``, where it builds; else through ``paged_decode_fused``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minirunner.custom_ops import define
from minirunner.kernels import paged_decode_cpu as cpu_kernel


def slot_rows(slot_mapping: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    """Rows of the cache viewed as [num_blocks * 2 * block_size, H_kv, D] where each slot's K and V go:
    int64 [2 * num_tokens], the K rows then the V rows. Slot -1 lands in the last block's last slot
    (floor division gives block -1, offset block_size - 1; negative rows wrap), i.e. the null block."""
    n, bs = kv_cache.shape[0], kv_cache.shape[2]
    blocks = torch.div(slot_mapping, bs, rounding_mode="floor")
    k_rows = blocks * (2 * bs) + (slot_mapping - blocks * bs)
    return torch.cat((k_rows, k_rows + bs)).remainder(n * 2 * bs)


def store_kv_padded(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Write k, v at their slots with one copy and no host sync; slot -1 rows land in the null block.

    k, v: [num_tokens, num_kv_heads, head_dim]; kv_cache: [num_blocks + 1, 2, block_size, num_kv_heads,
    head_dim] (contiguous) whose last block is scratch; slot_mapping: int64 [num_tokens]; rows: the
    slots' :func:`slot_rows`, when already computed for this step.
    """
    n, _, bs, h, d = kv_cache.shape
    if rows is None:
        rows = slot_rows(slot_mapping, kv_cache)
    kv = torch.cat((k, v))
    if kv.dtype != kv_cache.dtype:
        kv = kv.to(kv_cache.dtype)
    kv_cache.view(n * 2 * bs, h, d).index_copy_(0, rows, kv)


def gather_rows(block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache rows (as in :func:`slot_rows`) of every K slot the block tables reach, in order, then the
    same for V: int64 [2, num_seqs, num_blocks_per_seq * block_size] (V rows = K rows + block_size)."""
    offsets = torch.arange(block_size, device=block_tables.device)
    k_rows = (block_tables.long()[:, :, None] * (2 * block_size) + offsets).flatten(1)
    return torch.stack((k_rows, k_rows + block_size))


def gather_kv(kv_cache: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype):
    """K and V at the given :func:`gather_rows`: two [num_seqs, num_kv_heads, L, head_dim] views in
    ``dtype``. index_select copies whole rows (H_kv x D values each), much faster than fancy indexing."""
    n, _, bs, h, d = kv_cache.shape
    _, s, length = rows.shape
    kv = kv_cache.view(n * 2 * bs, h, d).index_select(0, rows.view(-1)).view(2, s, length, h, d)
    if kv.dtype != dtype:
        kv = kv.to(dtype)
    return kv[0].transpose(1, 2), kv[1].transpose(1, 2)


def paged_decode_vectorized(q: torch.Tensor, kv_cache: torch.Tensor, k_rows: torch.Tensor,
                            key_mask: torch.Tensor, row_valid: torch.Tensor | None,
                            scale: float) -> torch.Tensor:
    """One query token per sequence, all sequences in one SDPA call.

    q: [num_seqs, num_q_heads, head_dim]; k_rows: int64 [2, num_seqs, L] (:func:`gather_rows` of the
    block-table columns covering the longest sequence); key_mask: bool [num_seqs, 1, 1, L] (True =
    attend); row_valid: [num_seqs, 1, 1] in q's dtype (0 for padding rows, whose output must be zeros) or
    None when there are none. Returns [num_seqs, num_q_heads, head_dim].
    """
    s, hq, d = q.shape
    k, v = gather_kv(kv_cache, k_rows, q.dtype)
    hkv = k.shape[1]
    # [S, Hkv, G, D]: the G query heads sharing a KV head act as G query rows of that head.
    out = F.scaled_dot_product_attention(q.reshape(s, hkv, hq // hkv, d), k, v, attn_mask=key_mask,
                                         scale=scale)
    out = out.reshape(s, hq, d)
    return out if row_valid is None else out * row_valid


def paged_decode_fused(q: torch.Tensor, kv_cache: torch.Tensor, k_rows: torch.Tensor,
                       key_mask: torch.Tensor, row_valid: torch.Tensor | None, scale: float) -> torch.Tensor:
    """:func:`paged_decode_vectorized` written for ``torch.compile``: the same attention as products and
    sums over indexed cache rows, which inductor fuses into loops that read each K and V row where it
    lies, with no gathered copy of K and V and no SDPA call. Eagerly this form would build
    [num_seqs, L, H_kv, G, head_dim] products, so eager steps keep the gather and SDPA. Scores, softmax
    and sums in fp32; same arguments and result."""
    s, hq, d = q.shape
    n, _, bs, h, _ = kv_cache.shape
    rows = kv_cache.view(n * 2 * bs, h, d)
    k, v = rows[k_rows[0]].float(), rows[k_rows[1]].float()  # [S, L, Hkv, D], indexed inside the loops
    g = hq // h
    scores = (q.float().view(s, 1, h, g, d) * k[:, :, :, None, :]).sum(-1) * scale  # [S, L, Hkv, G]
    scores = scores.masked_fill(~key_mask.view(s, -1, 1, 1), float("-inf"))
    p = torch.softmax(scores, dim=1)
    out = (p[..., None] * v[:, :, :, None, :]).sum(1).reshape(s, hq, d).to(q.dtype)  # [S, Hkv, G, D]
    return out if row_valid is None else out * row_valid


paged_decode_cpu = define(
    "paged_decode_cpu(Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale) "
    "-> Tensor",
    cpu_kernel.paged_decode_cpu, lambda q, kv_cache, block_tables, seq_lens, scale: q.new_empty(q.shape))


def paged_prefill_vectorized(q_pad: torch.Tensor, kv_cache: torch.Tensor, k_rows: torch.Tensor,
                             mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Ragged queries padded to one length, causal over each sequence's cached prefix + new tokens.

    q_pad: [num_seqs, max_q, num_q_heads, head_dim]; k_rows: int64 [2, num_seqs, L]; mask: bool
    [num_seqs, 1, max_q * G, L] with row i * G + g for query token i and head g of a group
    (G = num_q_heads // num_kv_heads). Returns [num_seqs, max_q, num_q_heads, head_dim].
    """
    s, mq, hq, d = q_pad.shape
    k, v = gather_kv(kv_cache, k_rows, q_pad.dtype)
    hkv = k.shape[1]
    g = hq // hkv
    q5 = q_pad.view(s, mq, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(s, hkv, mq * g, d)
    out = F.scaled_dot_product_attention(q5, k, v, attn_mask=mask, scale=scale)
    return out.view(s, hkv, mq, g, d).permute(0, 2, 1, 3, 4).reshape(s, mq, hq, d)

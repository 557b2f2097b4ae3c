"""Paged attention over a block-table KV cache: the Triton kernels for decode and prefill/extend, with
the signatures of their torch twins in ``paged_attention_ref`` (re-exported here, as is the KV write of
``store_kv``, so one import gives a kernel and its twin).

Owns the attention over ``kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_dim]``
(K at ``[:, 0]``, V at ``[:, 1]``). It never allocates KV blocks or decides which slots a
request owns (that is the runner's job).
"""

from __future__ import annotations

import torch

from minirunner.kernels._triton import next_pow2, tl, triton, upcast_for_interpreter
from minirunner.kernels.paged_attention_ref import paged_decode_ref, paged_prefill_ref
from minirunner.kernels.split_kv import decode_workspace, default_num_splits
from minirunner.kernels.store_kv import store_kv, store_kv_ref

__all__ = ["decode_workspace", "default_num_splits", "paged_decode", "paged_decode_ref", "paged_prefill",
           "paged_prefill_ref", "store_kv", "store_kv_ref"]


# ---------------------------------------------------------------------------------------------------
# Triton implementations. Same signatures, shapes and dtypes as the twins above.
#
# One attention kernel serves decode and prefill/extend. A program owns one KV head of one sequence and
# a block of BLOCK_M query "rows", where a row is a (query token, query head of the GQA group) pair:
# row r -> token r // GROUP_PAD, head r % GROUP_PAD. Packing the group's heads into rows lets decode
# (one token, GROUP heads) fill the M >= 16 that compiled tl.dot needs; rows past the group or past the
# sequence's query length are masked. KV is read in tiles of TILE tokens that may span several blocks
# (each token's physical block is looked up through the block table), so TILE does not depend on
# block_size (1, 16, 32, ... all work). Softmax is online (running max m, running sum l, base 2).
# Decode can also split a sequence's tiles over NUM_SPLITS programs (flash-decoding) when there are too
# few (sequence, KV head) pairs to fill the GPU; a second kernel merges the partial results.
# ---------------------------------------------------------------------------------------------------

_LOG2E = 1.4426950408889634


@triton.jit
def _find_seq_idx(query_start_loc_ptr, target, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest i with query_start_loc[i] // BLOCK_Q + i <= target (the sequence owning q block target)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        val = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if val <= target:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
    out_ptr, q_ptr, kv_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,
    scale_log2, num_seqs,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_kkv, stride_kt, stride_kh, stride_bt,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, TILE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, DECODE: tl.constexpr, NUM_SPLITS: tl.constexpr, UPCAST: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE:
        seq = tl.program_id(0)
        q_block = 0
        q_start = seq
        q_len = 1
    else:
        seq = _find_seq_idx(query_start_loc_ptr, tl.program_id(0), num_seqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        q_block = tl.program_id(0) - (q_start // BLOCK_Q + seq)
    seq_len = tl.load(seq_lens_ptr + seq)
    if not DECODE:
        # Past this sequence's queries, or a padding sequence: the output rows stay zero.
        if (q_block * BLOCK_Q >= q_len) | (seq_len == 0):
            return

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    tok = q_block * BLOCK_Q + offs_m // GROUP_PAD
    head_in_group = offs_m % GROUP_PAD
    row_valid = (tok < q_len) & (head_in_group < GROUP)
    q_head = kv_head * GROUP + head_in_group
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + q_head[:, None] * stride_qh + offs_d[None, :],
                mask=row_valid[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    context_len = seq_len - q_len
    q_pos = context_len + tok  # position of each row's query token in its sequence
    kv_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for t in range(tile_lo, tile_hi):
        offs_n = t * TILE + tl.arange(0, TILE)
        n_valid = offs_n < kv_end
        phys = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_valid, other=0).to(tl.int64)
        tok_base = kv_ptr + phys * stride_kb + (offs_n % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        # K loaded transposed, [HEAD_DIM_PAD, TILE], so the score tile is a plain q @ kT.
        kt = tl.load(tok_base[None, :] + offs_d[:, None],
                     mask=d_mask[:, None] & n_valid[None, :], other=0.0)
        v = tl.load(tok_base[:, None] + stride_kkv + offs_d[None, :],
                    mask=n_valid[:, None] & d_mask[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision="ieee") * scale_log2
        allowed = (offs_n[None, :] <= q_pos[:, None]) & n_valid[None, :]
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen no allowed key keeps m = -inf; shift by 0 there to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_ot + q_head[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_mask[None, :])
    else:
        # Partials of decode: [num_seqs, NUM_Q_HEADS, NUM_SPLITS] (+ HEAD_DIM for acc), fp32.
        part = (seq.to(tl.int64) * NUM_Q_HEADS + q_head) * NUM_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None] & d_mask[None, :])
        tl.store(part_m_ptr + part, m_i, mask=row_valid)
        tl.store(part_l_ptr + part, l_i, mask=row_valid)


@triton.jit
def _merge_splits_kernel(
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_ot, stride_oh,
    NUM_Q_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    part = (seq.to(tl.int64) * NUM_Q_HEADS + head) * NUM_SPLITS + offs_s
    m = tl.load(part_m_ptr + part, mask=s_mask, other=float("-inf"))
    l_part = tl.load(part_l_ptr + part, mask=s_mask, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max)  # empty splits have m = -inf, weight 0
    l_tot = tl.sum(w * l_part, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(l_tot > 0, l_tot, 1.0)
    tl.store(out_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=d_mask)


def _check_attention_inputs(q, kv_cache, block_tables):
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2:
        raise ValueError(f"kv_cache must be [num_blocks, 2, block_size, num_kv_heads, head_dim], "
                         f"got {tuple(kv_cache.shape)}")
    num_q_heads, num_kv_heads = q.shape[1], kv_cache.shape[3]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if q.shape[2] != kv_cache.shape[4]:
        raise ValueError(f"head_dim of q ({q.shape[2]}) and kv_cache ({kv_cache.shape[4]}) differ")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in its last (head_dim) dimension")
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    return q, block_tables


def paged_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    tile: int | None = None,
    workspace: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """Decode attention in Triton; same contract as :func:`paged_decode_ref`.

    q: [num_seqs, num_q_heads, head_dim] (fp32/fp16/bf16); kv_cache: [num_blocks, 2, block_size,
    num_kv_heads, head_dim] (same dtype); block_tables: int32 [num_seqs, max_blocks_per_seq]; seq_lens: int32
    [num_seqs] incl. the current token (0 = padding row -> zeros). Returns [num_seqs, num_q_heads, head_dim].
    num_splits (keyword, optional): programs per (sequence, KV head) along the sequence; None picks one
    from the GPU's size (always 1 on CPU). tile: KV tokens per inner step (power of 2, >= 16;
    None: 64 on CUDA, 32 in the interpreter). workspace (keyword, optional): preallocated (out, part_acc,
    part_m, part_l) from :func:`decode_workspace` for these shapes and num_splits, so a captured CUDA
    graph allocates nothing.
    """
    q, block_tables = _check_attention_inputs(q, kv_cache, block_tables)
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_q_heads // num_kv_heads
    group_pad = next_pow2(group)
    if num_splits is None:
        num_splits = default_num_splits(num_seqs * num_kv_heads,
                                         block_tables.shape[1] * block_size, q.device)
    if tile is None:
        tile = 64 if q.device.type == "cuda" else 32
    if workspace is None:
        workspace = decode_workspace(q, num_splits)
    out, part_acc, part_m, part_l = workspace
    if num_seqs == 0:
        return out
    head_dim_pad = max(16, next_pow2(head_dim))
    _paged_attention_kernel[(num_seqs, num_kv_heads, num_splits)](
        out, q, kv_cache, block_tables, seq_lens, seq_lens,
        part_acc, part_m, part_l,
        scale * _LOG2E, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_tables.stride(0),
        NUM_Q_HEADS=num_q_heads, GROUP=group, GROUP_PAD=group_pad, BLOCK_M=max(16, group_pad),
        TILE=tile, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_SIZE=block_size,
        DECODE=True, NUM_SPLITS=num_splits, UPCAST=upcast_for_interpreter(q),
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_q_heads)](
            out, part_acc, part_m, part_l, out.stride(0), out.stride(1),
            NUM_Q_HEADS=num_q_heads, NUM_SPLITS=num_splits, SPLITS_PAD=next_pow2(num_splits),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        )
    return out


def paged_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    block_m: int = 64,
    tile: int = 32,
) -> torch.Tensor:
    """Prefill/extend attention in Triton; same contract as :func:`paged_prefill_ref`.

    q: [num_tokens, num_q_heads, head_dim]; query_start_loc: int32 [num_seqs + 1]; seq_lens: int32
    [num_seqs]; block_tables: int32 [num_seqs, max_blocks_per_seq]. The queries of sequence i are its last
    ``qsl[i+1] - qsl[i]`` positions (causal over cached prefix + new tokens; k+1 queries per sequence is
    speculative verification). Rows outside every sequence, and of seq_len-0 sequences, are zeros.
    block_m (keyword): query rows per program ((token, head) pairs, >= 16); tile: KV tokens per step.
    """
    q, block_tables = _check_attention_inputs(q, kv_cache, block_tables)
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_q_heads // num_kv_heads
    group_pad = next_pow2(group)
    block_m = max(block_m, 16, group_pad)
    block_q = block_m // group_pad
    out = torch.zeros_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    # Sequence i owns q blocks [qsl[i] // block_q + i, qsl[i+1] // block_q + i + 1); this bounds them all.
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, 1)
    _paged_attention_kernel[grid](
        out, q, kv_cache, block_tables, seq_lens, query_start_loc,
        out, out, out,
        scale * _LOG2E, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_tables.stride(0),
        NUM_Q_HEADS=num_q_heads, GROUP=group, GROUP_PAD=group_pad, BLOCK_M=block_m,
        TILE=tile, HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
        BLOCK_SIZE=block_size, DECODE=False, NUM_SPLITS=1, UPCAST=upcast_for_interpreter(q),
    )
    return out

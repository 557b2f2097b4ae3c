"""The KV write: each token's K and V into its slot of the paged cache, as a torch twin and a Triton
kernel with the same signature. Slot -1 (a padding row) writes nothing.

Owns only the write; which slot a token gets is the block table's (``minirunner.kv.block_table``).
"""

from __future__ import annotations

import torch

from minirunner.kernels._triton import next_pow2, tl, triton


def store_kv_ref(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write new K/V into the paged cache in place; slot -1 means "do not write" (padding).

    k, v: [num_tokens, num_kv_heads, head_dim]; kv_cache: [num_blocks, 2, block_size, num_kv_heads,
    head_dim]; slot_mapping: int64 [num_tokens], slot = block * block_size + offset.
    """
    block_size = kv_cache.shape[2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    kv_cache[blocks, 0, offsets] = k[valid].to(kv_cache.dtype)
    kv_cache[blocks, 1, offsets] = v[valid].to(kv_cache.dtype)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, kv_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ckv, stride_ct, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    dst = kv_ptr + block * stride_cb + offset * stride_ct + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(dst, k.to(kv_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_ckv, v.to(kv_ptr.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Triton twin of :func:`store_kv_ref`: write K/V into the paged cache in place, skipping slot -1.

    k, v: [num_tokens, num_kv_heads, head_dim]; kv_cache: [num_blocks, 2, block_size, num_kv_heads,
    head_dim]; slot_mapping: int64 (or int32) [num_tokens]. One program per token.
    """
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in its last (head_dim) dimension")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k, v, kv_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=next_pow2(num_kv_heads),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), BLOCK_SIZE=kv_cache.shape[2],
    )

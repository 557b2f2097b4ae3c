"""Paged attention and store_kv: Triton kernels (interpreter on CPU) against their torch twins, and
the twins against dense attention on contiguous K/V."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from minirunner.kernels.paged_attention import (
    paged_decode,
    paged_decode_ref,
    paged_prefill,
    paged_prefill_ref,
    store_kv,
    store_kv_ref,
)
from minirunner.kernels.testing import random_paged_batch

# The Triton kernels run on CPU tensors only in the interpreter, which tests/conftest.py turns on when
# CUDA is absent; on a CUDA machine the gpu-marked tests cover the compiled kernels instead.
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}

# (block_size, head_dim, num_q_heads, num_kv_heads, dtype, seq_lens). Together the cases cover block
# sizes 1/16/32, head_dim 64/128, GQA 1/2/4/8 (and a non-power-of-2 group), lengths that cross a
# block boundary, equal a block multiple and are 1, and padding rows (seq_len 0).
DECODE_CASES = [
    (16, 64, 2, 2, torch.float32, [17, 16, 1, 0, 33]),
    (1, 128, 4, 2, torch.float16, [5, 1, 0, 3]),
    (32, 64, 8, 2, torch.float32, [64, 33, 1, 0]),
    (16, 128, 8, 1, torch.float16, [48, 31, 1]),
    (16, 64, 6, 2, torch.float32, [20, 1]),
]


@needs_interpreter
@pytest.mark.parametrize("block_size,head_dim,hq,hkv,dtype,seq_lens", DECODE_CASES)
def test_paged_decode_matches_twin(block_size, head_dim, hq, hkv, dtype, seq_lens):
    b = random_paged_batch(seq_lens, [1 if s else 0 for s in seq_lens], hq, hkv, head_dim,
                           block_size, dtype)
    # decode has one query row per sequence, padding rows included
    q = torch.randn(len(seq_lens), hq, head_dim).to(dtype)
    scale = head_dim**-0.5
    got = paged_decode(q, b.kv_cache, b.block_tables, b.seq_lens, scale)
    want = paged_decode_ref(q, b.kv_cache, b.block_tables, b.seq_lens, scale)
    assert got.dtype == q.dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    pad = b.seq_lens == 0
    assert torch.all(got[pad] == 0)


@needs_interpreter
@pytest.mark.parametrize("num_splits", [2, 4])
def test_split_kv_decode_matches_twin(num_splits):
    """Flash-decoding split over the sequence; some splits of short/padding rows are empty."""
    seq_lens = [70, 1, 0, 16, 33]
    b = random_paged_batch(seq_lens, [1 if s else 0 for s in seq_lens], 8, 2, 64, 16)
    q = torch.randn(len(seq_lens), 8, 64)
    got = paged_decode(q, b.kv_cache, b.block_tables, b.seq_lens, 0.125, num_splits=num_splits)
    want = paged_decode_ref(q, b.kv_cache, b.block_tables, b.seq_lens, 0.125)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# (block_size, head_dim, hq, hkv, dtype, seq_lens, query_lens): whole prompts, extends over a cached
# prefix, k+1 = 4 speculative-verification queries, single tokens, padding rows.
PREFILL_CASES = [
    (16, 64, 4, 2, torch.float32, [17, 5, 0, 32], [17, 2, 0, 32]),
    (1, 128, 4, 1, torch.float16, [9, 4, 1], [3, 4, 1]),
    (32, 64, 8, 1, torch.float32, [40, 33, 7, 0], [40, 4, 7, 0]),
    (16, 128, 2, 2, torch.float16, [16, 20], [16, 4]),
    (32, 64, 6, 2, torch.float32, [35, 3], [35, 3]),
]


@needs_interpreter
@pytest.mark.parametrize("block_size,head_dim,hq,hkv,dtype,seq_lens,query_lens", PREFILL_CASES)
def test_paged_prefill_matches_twin(block_size, head_dim, hq, hkv, dtype, seq_lens, query_lens):
    b = random_paged_batch(seq_lens, query_lens, hq, hkv, head_dim, block_size, dtype)
    scale = head_dim**-0.5
    args = (b.q, b.kv_cache, b.block_tables, b.query_start_loc, b.seq_lens, scale)
    got, want = paged_prefill(*args), paged_prefill_ref(*args)
    assert got.dtype == b.q.dtype and got.shape == b.q.shape
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@needs_interpreter
def test_prefill_small_query_blocks_and_trailing_rows():
    """Several q blocks per sequence (block_m=16 -> 4 tokens of a 4-head group per program), and
    query rows past query_start_loc[-1] (a padded token buffer) come back as zeros."""
    b = random_paged_batch([30, 9], [13, 9], 8, 2, 64, 16)
    q = torch.cat([b.q, torch.randn(3, 8, 64)])
    got = paged_prefill(q, b.kv_cache, b.block_tables, b.query_start_loc, b.seq_lens, 0.125,
                        block_m=16)
    want = paged_prefill_ref(q, b.kv_cache, b.block_tables, b.query_start_loc, b.seq_lens, 0.125)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.all(got[-3:] == 0)


@needs_interpreter
def test_prefill_with_one_query_per_sequence_equals_decode():
    """The two Triton paths agree where their contracts overlap (uniform decode)."""
    b = random_paged_batch([18, 1, 32], [1, 1, 1], 4, 2, 64, 16)
    pre = paged_prefill(b.q, b.kv_cache, b.block_tables, b.query_start_loc, b.seq_lens, 0.1)
    dec = paged_decode(b.q, b.kv_cache, b.block_tables, b.seq_lens, 0.1)
    torch.testing.assert_close(pre, dec, atol=1e-6, rtol=1e-6)


def _dense_causal(q, k, v, context_len, scale):
    """Attention on contiguous K/V with torch's SDPA: the independent oracle for the twins."""
    n, total = q.shape[0], k.shape[0]
    mask = torch.arange(total)[None, :] <= torch.arange(n)[:, None] + context_len
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def test_twins_equal_dense_attention_on_contiguous_kv():
    """Scatter known contiguous K/V into random blocks through store_kv_ref; the paged twins read
    it back and must equal dense causal attention."""
    torch.manual_seed(0)
    block_size, hq, hkv, d = 4, 4, 2, 16
    seq_lens, query_lens = [9, 4, 1], [3, 4, 1]
    ks = [torch.randn(s, hkv, d) for s in seq_lens]
    vs = [torch.randn(s, hkv, d) for s in seq_lens]
    qs = [torch.randn(n, hq, d) for n in query_lens]
    num_blocks = 8
    kv_cache = torch.zeros(num_blocks, 2, block_size, hkv, d)
    free = torch.randperm(num_blocks).tolist()
    block_tables = torch.zeros(3, 3, dtype=torch.int32)
    for i, s in enumerate(seq_lens):
        for j in range((s + block_size - 1) // block_size):
            block_tables[i, j] = free.pop()
        pos = torch.arange(s)
        slots = block_tables[i, pos // block_size].long() * block_size + pos % block_size
        store_kv_ref(ks[i], vs[i], kv_cache, slots)
    qsl = torch.tensor([0, 3, 7, 8], dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    got = paged_prefill_ref(torch.cat(qs), kv_cache, block_tables, qsl, sl, 0.3)
    for i in range(3):
        want = _dense_causal(qs[i], ks[i], vs[i], seq_lens[i] - query_lens[i], 0.3)
        torch.testing.assert_close(got[qsl[i]:qsl[i + 1]], want, atol=1e-5, rtol=1e-5)
    q_dec = torch.randn(3, hq, d)
    got = paged_decode_ref(q_dec, kv_cache, block_tables, sl, 0.3)
    for i in range(3):
        want = _dense_causal(q_dec[i:i + 1], ks[i], vs[i], seq_lens[i] - 1, 0.3)
        torch.testing.assert_close(got[i:i + 1], want, atol=1e-5, rtol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("block_size,hkv,d,cache_dtype", [
    (1, 2, 64, torch.float32), (16, 4, 128, torch.float16), (32, 1, 64, torch.float32)])
def test_store_kv_matches_twin_and_skips_padding(block_size, hkv, d, cache_dtype):
    torch.manual_seed(block_size)
    num_blocks, n = 12, 11
    slots = torch.randperm(num_blocks * block_size)[:n].long()
    slots[[2, 7]] = -1  # padding rows
    k, v = torch.randn(n, hkv, d), torch.randn(n, hkv, d)
    base = torch.randn(num_blocks, 2, block_size, hkv, d).to(cache_dtype)
    got, want = base.clone(), base.clone()
    store_kv(k, v, got, slots)
    store_kv_ref(k, v, want, slots)
    assert torch.equal(got, want)
    # Independently: each written slot holds its row, and nothing else changed.
    flat = got.permute(1, 0, 2, 3, 4).reshape(2, -1, hkv, d)
    written = slots >= 0
    assert torch.equal(flat[0, slots[written]], k[written].to(cache_dtype))
    assert torch.equal(flat[1, slots[written]], v[written].to(cache_dtype))
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots[written]] = False
    base_flat = base.permute(1, 0, 2, 3, 4).reshape(2, -1, hkv, d)
    assert torch.equal(flat[:, untouched], base_flat[:, untouched])


@needs_interpreter
def test_store_kv_reads_strided_views():
    """K/V arrive as views of a fused qkv projection (non-contiguous rows)."""
    qkv = torch.randn(5, 3, 2, 64)
    k, v = qkv[:, 1], qkv[:, 2]
    slots = torch.tensor([3, -1, 0, 7, 12])
    got, want = torch.zeros(4, 2, 4, 2, 64), torch.zeros(4, 2, 4, 2, 64)
    store_kv(k, v, got, slots)
    store_kv_ref(k, v, want, slots)
    assert torch.equal(got, want)

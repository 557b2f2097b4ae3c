"""Compiled Triton kernels against their torch twins on a CUDA GPU, in fp16 and bf16 (and the exact
ones, store_kv / prepare_inputs / sample, bit for bit). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from minirunner.kernels.input_prep import prepare_inputs, prepare_inputs_ref
from minirunner.kernels.paged_attention import (
    paged_decode,
    paged_decode_ref,
    paged_prefill,
    paged_prefill_ref,
    store_kv,
    store_kv_ref,
)
from minirunner.kernels.sampling import sample, sample_ref
from minirunner.kernels.testing import random_paged_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton)"),
]

# fp16 / bf16 outputs: the kernel rounds P to the input dtype before P @ V (as flash attention
# does); the twin stays in fp32 until the end.
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}
DTYPES = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,head_dim,hq,hkv,num_splits", [
    (16, 128, 32, 8, None), (1, 64, 8, 8, 1), (32, 128, 16, 2, 4), (16, 64, 12, 4, 3)])
def test_decode_compiled(dtype, block_size, head_dim, hq, hkv, num_splits):
    seq_lens = [1, 15, 16, 17, 0, 300, 1025, 64]
    b = random_paged_batch(seq_lens, [1 if s else 0 for s in seq_lens], hq, hkv, head_dim,
                           block_size, dtype, "cuda")
    q = torch.randn(len(seq_lens), hq, head_dim, device="cuda", dtype=dtype)
    got = paged_decode(q, b.kv_cache, b.block_tables, b.seq_lens, head_dim**-0.5,
                       num_splits=num_splits)
    want = paged_decode_ref(q, b.kv_cache, b.block_tables, b.seq_lens, head_dim**-0.5)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.all(got[b.seq_lens == 0] == 0)


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32])
@pytest.mark.parametrize("block_size,head_dim,hq,hkv", [(16, 128, 32, 8), (1, 64, 4, 4),
                                                        (32, 128, 16, 2)])
def test_prefill_compiled(dtype, block_size, head_dim, hq, hkv):
    seq_lens, query_lens = [200, 37, 0, 16, 300, 5], [200, 4, 0, 16, 1, 5]
    b = random_paged_batch(seq_lens, query_lens, hq, hkv, head_dim, block_size, dtype, "cuda")
    args = (b.q, b.kv_cache, b.block_tables, b.query_start_loc, b.seq_lens, head_dim**-0.5)
    got, want = paged_prefill(*args), paged_prefill_ref(*args)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_compiled(dtype):
    num_blocks, bs, hkv, d, n = 64, 16, 8, 128, 300
    slots = torch.randperm(num_blocks * bs, device="cuda")[:n]
    slots[::7] = -1
    k = torch.randn(n, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(n, hkv, d, device="cuda", dtype=dtype)
    got = torch.randn(num_blocks, 2, bs, hkv, d, device="cuda", dtype=dtype)
    want = got.clone()
    store_kv(k, v, got, slots)
    store_kv_ref(k, v, want, slots)
    assert torch.equal(got, want)


def test_prepare_inputs_compiled():
    gen = torch.Generator().manual_seed(0)
    max_reqs, max_blocks, bs, num_reqs, max_seqs = 256, 32, 16, 100, 128
    rows = torch.randperm(max_reqs, generator=gen)[:num_reqs].int()
    num_computed = torch.randint(0, 256, (max_reqs,), generator=gen, dtype=torch.int32)
    query_lens = torch.randint(1, 200, (num_reqs,), generator=gen, dtype=torch.int32)
    query_lens[::2] = 1
    block_tables = torch.randint(0, 10000, (max_reqs, max_blocks), generator=gen,
                                 dtype=torch.int32)
    max_tokens = int(query_lens.sum()) + 40

    def bufs():
        return [torch.full((max_tokens,), 9, dtype=torch.int64, device="cuda"),
                torch.full((max_tokens,), 9, dtype=torch.int64, device="cuda"),
                torch.full((max_seqs,), 9, dtype=torch.int32, device="cuda"),
                torch.full((max_seqs + 1,), 9, dtype=torch.int32, device="cuda"),
                torch.full((max_seqs, max_blocks), 9, dtype=torch.int32, device="cuda")]

    ins = [t.cuda() for t in (rows, query_lens, num_computed, block_tables)]
    got, want = bufs(), bufs()
    prepare_inputs(*ins, bs, *got)
    prepare_inputs_ref(*ins, bs, *want)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32] + DTYPES)
def test_sample_compiled(dtype):
    n, vocab = 64, 32000
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(n, vocab, generator=gen) * 3).to(dtype).cuda()
    temps = (torch.rand(n, generator=gen) + 0.2).cuda()
    temps[:8] = 0
    top_k = torch.full((n,), -1, dtype=torch.int64, device="cuda")
    top_k[8:16] = 20
    top_p = torch.ones(n, device="cuda")
    top_p[16:24] = 0.8
    seeds = torch.randint(0, 2**62, (n,), generator=gen).cuda()
    positions = torch.arange(n, device="cuda") * 97
    got = sample(logits, temps, top_k, top_p, seeds, positions)
    want = sample_ref(logits, temps, top_k, top_p, seeds, positions)
    assert torch.equal(got, want)

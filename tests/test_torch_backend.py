"""The vectorised torch attention backend equals the per-sequence ``_ref`` twins: decode, prefill, extend
and mixed batches, GQA, lengths on and across block boundaries, padding rows, and the K/V write."""

from __future__ import annotations

import pytest
import torch
from attention_meta import make_meta

from minirunner.attention.torch_backend import TorchAttentionBackend
from minirunner.attention.torch_ops import store_kv_padded
from minirunner.kernels.paged_attention import paged_decode_ref, paged_prefill_ref, store_kv_ref
from minirunner.kernels.testing import random_paged_batch


def _with_null_block(kv_cache: torch.Tensor) -> torch.Tensor:
    """The runner's layout: one extra scratch block after the pool's blocks."""
    return torch.cat([kv_cache, torch.full_like(kv_cache[:1], float("nan"))])


def _backend(hq, hkv, d, bs, dtype=torch.float32):
    return TorchAttentionBackend(hq, hkv, d, d ** -0.5, bs, torch.device("cpu"), dtype)


CASES = [  # (seq_lens, query_lens)
    ([1, 16, 17, 33, 5], [1, 1, 1, 1, 1]),  # decode: lengths 1, a block multiple, just past one
    ([7, 0, 40, 0], [1, 1, 1, 1]),  # decode with padding rows (CUDA-graph padding)
    ([9, 32, 3], [9, 32, 3]),  # prefill from empty
    ([20, 48, 5], [4, 15, 5]),  # extend after a cached prefix (chunked prefill / prefix hits)
    ([20, 1, 37, 64, 2], [4, 1, 1, 30, 2]),  # mixed: decode rows beside prefill chunks
    ([21, 4, 40, 17], [4, 4, 4, 4]),  # uniform: a speculative verify step (k + 1 = 4 queries each)
]


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1), (6, 3)], ids=lambda h: f"gqa{h[0]}:{h[1]}")
@pytest.mark.parametrize("block_size", [1, 16, 7])
@pytest.mark.parametrize("case", CASES, ids=["decode", "decode_pad", "prefill", "extend", "mixed",
                                                "uniform_verify"])
def test_forward_matches_ref(case, block_size, heads):
    seq_lens, query_lens = case
    hq, hkv = heads
    d = 32
    # random_paged_batch gives padding rows no queries; decode padding rows carry one query row each.
    qls = [q if s else 0 for s, q in zip(seq_lens, query_lens, strict=True)]
    b = random_paged_batch(seq_lens, qls, hq, hkv, d, block_size, seed=block_size + hq)
    meta = make_meta(seq_lens, query_lens, b.block_tables, block_size)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(meta.num_tokens, hq, d, generator=gen)
    k = torch.randn(meta.num_tokens, hkv, d, generator=gen)
    v = torch.randn(meta.num_tokens, hkv, d, generator=gen)

    want_cache = b.kv_cache.clone()
    store_kv_ref(k, v, want_cache, meta.slot_mapping)
    if meta.is_decode_only:
        want = paged_decode_ref(q, want_cache, meta.block_tables, meta.seq_lens, d ** -0.5)
    else:
        want = paged_prefill_ref(q, want_cache, meta.block_tables, meta.query_start_loc,
                                 meta.seq_lens, d ** -0.5)
        # the ref leaves the rows of padding sequences at zero; so must we
    backend = _backend(hq, hkv, d, block_size)
    cache = _with_null_block(b.kv_cache)
    backend.plan(meta)
    got = backend.forward(q, k, v, cache, meta)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache[:-1], want_cache, atol=0, rtol=0)


def test_padding_rows_never_touch_real_blocks():
    kv = torch.randn(5, 2, 4, 2, 8)
    cache = _with_null_block(kv)
    slots = torch.tensor([-1, 6, -1, 13])
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    store_kv_padded(k, v, cache, slots)
    want = kv.clone()
    store_kv_ref(k, v, want, slots)
    assert torch.equal(cache[:-1], want)


def test_bf16_close_to_fp32_ref():
    seq_lens, query_lens = [20, 1, 37], [4, 1, 1]
    b = random_paged_batch(seq_lens, query_lens, 8, 2, 64, 16, seed=3)
    meta = make_meta(seq_lens, query_lens, b.block_tables, 16)
    q = torch.randn(meta.num_tokens, 8, 64)
    k = v = torch.zeros(meta.num_tokens, 2, 64)
    ref_cache = b.kv_cache.clone()
    store_kv_ref(k, v, ref_cache, meta.slot_mapping)
    want = paged_prefill_ref(q, ref_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.125)
    backend = _backend(8, 2, 64, 16, torch.bfloat16)
    backend.plan(meta)
    got = backend.forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), _with_null_block(b.kv_cache).bfloat16(),
                          meta)
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("host_tables", [True, False], ids=["host_tables", "device_tables"])
@pytest.mark.parametrize("split", [True, False])
def test_length_groups_match_ref(split, host_tables):
    """A large decode batch of very different lengths (split into length groups, each padded to its own
    longest) and the same batch with padding rows mixed in."""
    g = torch.Generator().manual_seed(5)
    seq_lens = [int(x) for x in torch.randint(1, 200, (40,), generator=g)] + [1000] * 4
    seq_lens[3] = seq_lens[17] = 0
    query_lens = [1] * len(seq_lens)
    b = random_paged_batch(seq_lens, [1 if s else 0 for s in seq_lens], 8, 2, 16, 16, seed=2)
    meta = make_meta(seq_lens, query_lens, b.block_tables, 16, host_tables)
    q = torch.randn(meta.num_tokens, 8, 16, generator=g)
    k, v = torch.randn(meta.num_tokens, 2, 16, generator=g), torch.randn(meta.num_tokens, 2, 16, generator=g)
    want_cache = b.kv_cache.clone()
    store_kv_ref(k, v, want_cache, meta.slot_mapping)
    want = paged_decode_ref(q, want_cache, meta.block_tables, meta.seq_lens, 0.25)
    backend = _backend(8, 2, 16, 16)
    backend.split_decode_by_length = split
    backend.plan(meta)
    assert (len(backend._decode) > 1) == split
    got = backend.forward(q, k, v, _with_null_block(b.kv_cache), meta)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("host_tables", [True, False], ids=["host_tables", "device_tables"])
@pytest.mark.parametrize("max_groups", [4, 1])
def test_prefill_length_groups_match_ref(max_groups, host_tables):
    """Prompts admitted together with very different lengths, beside extend chunks and decode rows: the
    prefill sequences are split into length groups (each padded to its own longest query and context)
    or kept as one padded group, and either way equal the per-sequence reference."""
    g = torch.Generator().manual_seed(7)
    prompts = [2, 150, 9, 3, 77, 40, 5, 120, 16, 1]
    seq_lens = prompts + [60, 33, 90, 12]  # four extend chunks after a cached prefix
    query_lens = prompts + [5, 33, 1, 1]  # ... and two of them decode rows
    b = random_paged_batch(seq_lens, query_lens, 8, 2, 16, 4, seed=4)
    meta = make_meta(seq_lens, query_lens, b.block_tables, 4, host_tables)
    q = torch.randn(meta.num_tokens, 8, 16, generator=g)
    k, v = torch.randn(meta.num_tokens, 2, 16, generator=g), torch.randn(meta.num_tokens, 2, 16, generator=g)
    want_cache = b.kv_cache.clone()
    store_kv_ref(k, v, want_cache, meta.slot_mapping)
    want = paged_prefill_ref(q, want_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.25)
    backend = _backend(8, 2, 16, 4)
    backend.MAX_PREFILL_GROUPS = max_groups
    backend.plan(meta)
    assert (len(backend._prefill) > 1) == (max_groups > 1)
    got = backend.forward(q, k, v, _with_null_block(b.kv_cache), meta)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", CASES[:2], ids=["decode", "decode_pad"])
def test_compiled_decode_matches_ref(case):
    """Under torch.compile (graph_mode="compile") a decode step attends through the fused form
    (paged_decode_fused), not gather + SDPA: the same attention, the same padding rows left at zero."""
    seq_lens, query_lens = case
    hq, hkv, d, block_size = 8, 2, 32, 7
    qls = [q if s else 0 for s, q in zip(seq_lens, query_lens, strict=True)]
    b = random_paged_batch(seq_lens, qls, hq, hkv, d, block_size, seed=3)
    meta = make_meta(seq_lens, query_lens, b.block_tables, block_size)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(meta.num_tokens, h, d, generator=gen) for h in (hq, hkv, hkv))
    want_cache = b.kv_cache.clone()
    store_kv_ref(k, v, want_cache, meta.slot_mapping)
    want = paged_decode_ref(q, want_cache, meta.block_tables, meta.seq_lens, d ** -0.5)
    backend = _backend(hq, hkv, d, block_size)
    cache = _with_null_block(b.kv_cache)
    backend.plan(meta)
    torch._dynamo.reset()  # noqa: SLF001 (torch op)
    got = torch.compile(lambda *a: backend.forward(*a, meta), fullgraph=True, dynamic=False)(q, k, v, cache)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache[:-1], want_cache, atol=0, rtol=0)

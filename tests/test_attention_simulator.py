"""Notebook 08's numpy mechanisms (``simulators.attention``) against the runner's twin: the online softmax,
split-KV partials and their merge, the grouped paged read, the bytes model and its fit, the launch
schedule and the stored H200 kernel report."""

from __future__ import annotations

import math

import numpy as np
import pytest
from attention_twins import twin_head, twin_paged

from simulators.attention import (
    DecodeShape,
    PagedKV,
    bits_differ,
    fit_path,
    kernel_report,
    merge_partials,
    online_softmax_attention,
    paged_decode_grouped,
    path_bytes,
    schedule_programs,
    split_partials,
    ulp_distance,
)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_online_softmax_matches_the_twin(chunk):
    rng = np.random.default_rng(chunk)
    q, k, v = rng.standard_normal(16), rng.standard_normal((300, 16)), rng.standard_normal((300, 16))
    out, m, l_sum = online_softmax_attention(q, k, v, 0.25, chunk)
    assert np.allclose(out, twin_head(q, k, v, 0.25), atol=1e-6)
    s = k @ q * 0.25
    assert m == pytest.approx(s.max()) and l_sum == pytest.approx(np.exp(s - s.max()).sum())


def test_float32_chunkings_differ_in_bits_but_not_in_value():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (64, (2048, 64), (2048, 64)))
    outs = {c: online_softmax_attention(q, k, v, 0.125, c)[0] for c in (16, 64, 256)}
    assert all(o.dtype == np.float32 for o in outs.values())
    assert bits_differ(outs[16], outs[256]) > 0 and ulp_distance(outs[16], outs[256]) > 0
    assert np.allclose(outs[16], outs[256], rtol=1e-5, atol=1e-6)
    assert bits_differ(outs[64], outs[64].copy()) == 0 and ulp_distance(outs[64], outs[64]) == 0


def test_ulp_distance_counts_units_in_the_last_place():
    x = np.array([1.0, -2.0, 0.0], dtype=np.float32)
    assert ulp_distance(x, np.nextafter(x, np.float32(10))) == 1
    assert ulp_distance(np.float32([-0.0]), np.float32([0.0])) == 0


@pytest.mark.parametrize("splits", [1, 2, 3, 8, 20])
def test_split_partials_merge_to_the_twin(splits):
    rng = np.random.default_rng(splits)
    q, k, v = rng.standard_normal(8), rng.standard_normal((17, 8)), rng.standard_normal((17, 8))
    parts = split_partials(q, k, v, 0.3, splits)
    assert len(parts) == splits and (splits <= 17 or any(lse == -math.inf for _, lse in parts))
    assert np.allclose(merge_partials(parts), twin_head(q, k, v, 0.3), atol=1e-6)


def test_paged_decode_grouped_matches_the_twin_and_reads_once_per_kv_head():
    rng = np.random.default_rng(3)
    cache = rng.standard_normal((10, 2, 4, 2, 8))
    table = [7, 2, 9, 0]
    q = rng.standard_normal((8, 8))
    kv = PagedKV(cache)
    out = paged_decode_grouped(q, kv, table, 14, 0.35)
    assert np.allclose(out, twin_paged(q, cache, table, 14, 0.35), atol=1e-6)
    assert kv.reads == 4 * 2
    with pytest.raises(IndexError, match="outside the cache"):
        kv.read(10, 0)


def test_path_bytes():
    s = DecodeShape(batch=2, context=100, q_heads=8, kv_heads=2, head_dim=64)
    kv = 2 * 100 * 2 * 2 * 64 * 4
    assert s.kv_bytes == kv and s.group == 4 and s.score_bytes == 2 * 8 * 100 * 4
    assert path_bytes(s, "chunked") == kv
    assert path_bytes(s, "naive") == 3 * kv + 6 * s.score_bytes
    assert path_bytes(s, "twin") == 11 * kv + 6 * s.score_bytes
    with pytest.raises(ValueError, match="naive"):
        path_bytes(s, "fast")


def test_fit_path_recovers_the_two_terms():
    c0, bw = 2e-5, 1e9
    pts = [(b, c0 + b / bw) for b in (1_000, 100_000, 10_000_000)]
    got_c0, got_bw = fit_path(pts)
    assert got_c0 == pytest.approx(c0, rel=1e-6) and got_bw == pytest.approx(bw, rel=1e-6)
    flat_c0, flat_bw = fit_path([(1, 1.0), (1000, 1.0)])  # flat: the fixed cost alone
    assert flat_c0 == pytest.approx(1.0) and flat_bw > 1e12
    assert fit_path([(1000, 1e-6), (2000, 2e-6)])[0] == 0.0  # proportional: no fixed cost
    with pytest.raises(ValueError):
        fit_path([(10, 1.0)])


def test_schedule_programs_fills_sms_and_split_kv_shortens_a_lonely_sequence():
    one = schedule_programs(batch=1, heads=4, context=1024, num_splits=1, sms=16)
    split = schedule_programs(batch=1, heads=4, context=1024, num_splits=4, sms=16)
    assert len(one) == 4 and len({p.sm for p in one}) == 4  # 12 of 16 SMs idle
    assert max(p.end for p in one) == 1024 and max(p.end for p in split) == 256
    assert sum(p.end - p.start for p in split) == sum(p.end - p.start for p in one)  # same work
    busy = schedule_programs(batch=8, heads=4, context=100, sms=16)
    assert max(p.end for p in busy) == 200  # 32 programs on 16 SMs: two rounds
    for sm in range(16):
        spans = sorted((p.start, p.end) for p in busy if p.sm == sm)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # one at a time per SM
    with pytest.raises(ValueError):
        schedule_programs(0, 1, 1)


def test_kernel_report_reads_the_h200_figure_and_every_block_status():
    rep = kernel_report()
    if rep is None:
        pytest.skip("no H200 report committed")
    d = rep["decode"]
    assert d["fraction_of_copy_bandwidth"] == pytest.approx(d["triton_GBps"] / rep["copy_GBps"], rel=1e-6)
    assert rep["blocks"]["serving"] == "timed out" and rep["blocks"]["spec_decode"].startswith("failed")
    assert rep["blocks"]["kernel_bench"] == "passed" and rep["blocks"]["gpu_tests"].startswith("failed")
    assert "2 failed" in rep["tests"]

"""The contiguous KV layouts (the pre-paging baseline) in the same runner: the same greedy tokens as the
paged layout, reservations that are contiguous and never overlap, and clear refusals."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.kv.contiguous import ContiguousPool


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("layouts"), "llama_gqa")
    return str(path)


def _prompts(n=12, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 96, (int(k),), generator=g).tolist()
            for k in torch.randint(1, 40, (n,), generator=g)]


@pytest.mark.parametrize("layout", ["contiguous", "contiguous_exact"])
def test_contiguous_layout_gives_paged_greedy_tokens(model_dir, layout):
    prompts = _prompts()
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in range(4, 16)]
    kw = dict(dtype="float32", device="cpu", block_size=4, max_model_len=64, num_kv_blocks=40)
    paged = LLM(model_dir, **kw).generate(prompts, params, use_tqdm=False)
    llm = LLM(model_dir, kv_layout=layout, **kw)
    contiguous = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in contiguous] == [o.outputs[0].token_ids for o in paged]
    trace = llm.get_step_trace()
    # 40 blocks of 4 hold two 64-token reservations at most: the rest had to wait their turn
    if layout == "contiguous":
        assert max(t["num_running"] for t in trace) == 2
    assert all(t["num_preempted"] == 0 for t in trace)  # a reservation never runs out
    assert all(t["kv_slots_used"] <= t["kv_slots_allocated"] for t in trace)
    llm.engine.kv.check_invariants()
    assert llm.engine.block_pool.num_used_blocks == 0


def test_contiguous_reservation_shape(model_dir):
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4, max_model_len=64,
              num_kv_blocks=40, kv_layout="contiguous_exact", trace_block_tables=True)
    llm.generate([[5] * 10, [6] * 3], [SamplingParams(max_tokens=6, ignore_eos=True),
                                       SamplingParams(max_tokens=13, ignore_eos=True)], use_tqdm=False)
    tables = llm.get_step_trace()[0]["block_tables"]
    first, second = tables["0"], tables["1"]
    assert len(first) == 4 and len(second) == 4  # ceil(16 / 4), ceil(16 / 4): prompt + max_tokens
    assert first == list(range(first[0], first[0] + 4)) and second == list(range(4, 8))


def test_contiguous_refusals(model_dir):
    with pytest.raises(ValueError, match="prefix caching"):
        LLM(model_dir, device="cpu", kv_layout="contiguous", enable_prefix_caching=True)
    with pytest.raises(ValueError, match="kv_layout"):
        LLM(model_dir, device="cpu", kv_layout="virtual")
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4, max_model_len=64,
              num_kv_blocks=10, kv_layout="contiguous")
    with pytest.raises(ValueError, match="KV blocks"):  # a 64-token reservation needs 16 blocks
        llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=4))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 9)), min_size=1, max_size=40))
def test_first_fit_pool_never_overlaps_or_leaks(ops):
    pool = ContiguousPool(24, 4)
    held: list[list[int]] = []
    for reserve, n in ops:
        if reserve or not held:
            start = pool.reserve(n)
            if start is None:
                assert pool.largest_free_run < n  # refused only when no hole is big enough
            else:
                held.append(list(range(start, start + n)))
        else:
            run = held.pop(n % len(held))
            pool.release(run[0], len(run))
        pool.check_invariants(held)
    for run in held:
        pool.release(run[0], len(run))
    assert pool.starts == [0] and pool.lengths == [24]  # every hole merged back

"""Operator counting and step profiling on tiny models built from configs (no download, no mocks)."""

from __future__ import annotations

import pytest
import torch

from minirunner import LLM, SamplingParams
from minirunner.tools.profiling import BACKEND, OUTSIDE, launches_kernel, record_decode_step, replay_times
from minirunner.tools.step_timing import (
    calibrate_eager,
    measure_decode_steps,
    measure_op_overhead,
    write_overhead_twin,
)
from tests.tiny_models import make_tiny_model

# Operators each fixed part dispatches, derived by reading minirunner/model/*.py (not by running it), in
# float32 (the CPU default):
#  RMSNorm: one fused F.rms_norm -> 1.
#  Attention.forward's own: fused q/k/v linear, view, two slices (qk, v) -> 4; with q/k norm, one
#    rms_norm over the q and k heads and the mul by their stacked weights -> 2 (the q_norm / k_norm
#    modules hold the weights but are never called); apply_rotary on q and k together: mul, roll, mul,
#    add -> 4; the backend's q and k slices -> 2; out.reshape (a view) and the o linear -> 2.
#    So 14 with q/k norm, 12 without. (q_proj ... o_proj are views of fused weights, never called.)
#  MLP's own: fused gate/up linear, chunk, silu, mul, down linear -> 5; DecoderLayer's own: two adds.
#  RotaryEmbedding (once per step): positions.float() (to), [:, None] (unsqueeze), inv_freq[None, :]
#    (unsqueeze), mul, cos, to, sin, to, cat(cos, cos), [:, None, :] (unsqueeze; full slices dispatch
#    nothing), -sin (neg), cat, unsqueeze -> 13.
#  embed_tokens: one embedding; lm_head: one linear (its .float() runs outside any module).
RMSNORM = 1
PER_MODULE = {"input_layernorm": RMSNORM, "post_attention_layernorm": RMSNORM, "mlp": 5, "": 2}
ATTN_OWN = {"qwen3": 14, "llama": 12}
ONCE = {"model.embed_tokens": 1, "rotary": 13, "model.norm": RMSNORM, "lm_head": 1}


def _llm(path, **kw):
    return LLM(model=str(path), dtype="float32", device="cpu", attention_backend="torch",
               max_num_seqs=8, **kw)


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def tiny(request, tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, path


def _expected(name: str, num_layers: int = 2) -> dict[str, int]:
    per_layer = {**PER_MODULE, "self_attn": ATTN_OWN[name]}
    out = dict(ONCE)
    for i in range(num_layers):
        for mod, n in per_layer.items():
            out[f"model.layers.{i}" + (f".{mod}" if mod else "")] = n
    return out


@pytest.mark.parametrize("batch_size", [1, 3])
def test_operator_count_equals_the_hand_count(tiny, batch_size):
    name, path = tiny
    count = record_decode_step(_llm(path), batch_size=batch_size)
    expected = _expected(name)
    fixed = {k: v for k, v in count.by_module.items() if not k.startswith(BACKEND) and k != OUTSIDE}
    assert fixed == expected
    # every operator is accounted for: the fixed parts, the attention backend, the runner around them
    assert count.total == sum(expected.values()) + count.attention_backend + count.outside_model
    assert count.attention_backend > 0 and count.outside_model > 0
    # per layer: its fixed operators (the same in every layer) plus its attention-backend calls (the
    # backend may do per-step work once, in the first layer, so those need not be equal)
    per_layer = count.by_layer
    assert list(per_layer) == [0, 1]
    for i in (0, 1):
        backend_ops = count.by_module[f"{BACKEND}@model.layers.{i}.self_attn"]
        fixed_ops = sum(v for k, v in expected.items() if k.startswith(f"model.layers.{i}"))
        assert per_layer[i] == fixed_ops + backend_ops


def test_fixed_parts_do_not_grow_with_the_batch(tiny):
    _, path = tiny
    llm = _llm(path)
    small, large = record_decode_step(llm, 1), record_decode_step(llm, 6)
    fixed = lambda c: c.total - c.attention_backend - c.outside_model  # noqa: E731
    assert fixed(small) == fixed(large)
    assert large.under("model.layers.0.mlp") == small.under("model.layers.0.mlp") == PER_MODULE["mlp"]


def test_profiling_leaves_the_engine_idle_and_its_output_unchanged(tmp_path):
    path, _ = make_tiny_model(tmp_path, "qwen3")
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    fresh = [o.outputs[0].token_ids for o in _llm(path).generate(prompts, greedy, use_tqdm=False)]
    llm = _llm(path, enable_prefix_caching=True)
    users = llm.engine.add_request([3, 4, 5], greedy)  # finished but not collected yet: must survive
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    replay_times(record_decode_step(llm, 2, keep_args=True), passes=2)  # replays write the KV cache
    measure_decode_steps([llm], [1, 2], num_steps=2)
    assert not llm.engine.has_unfinished_requests() and list(llm.engine.requests) == [users]
    assert len(llm.engine.pop_finished(users).outputs[0].token_ids) == 12
    llm.engine.block_pool.check_invariants()
    after = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    assert after == fresh


def test_overhead_twin_dispatches_the_same_operators(tmp_path):
    path, _ = make_tiny_model(tmp_path, "qwen3")
    twin_dir = write_overhead_twin(path, tmp_path / "twin", width=4)
    real = record_decode_step(_llm(path), 2)
    twin = record_decode_step(_llm(twin_dir), 2)
    assert [(r.name, r.where) for r in real.records] == [(r.name, r.where) for r in twin.records]
    cal = calibrate_eager(_llm(path), _llm(twin_dir), batch_size=2, rounds=2, steps_per_round=1)
    assert cal.num_ops == real.total == len(cal.kernel_times)
    assert all(k >= 0 for k in cal.kernel_times)
    assert cal.host_per_op > 0 and cal.measured_step > 0


def test_bad_profiling_requests_are_refused(tmp_path):
    path, _ = make_tiny_model(tmp_path, "llama")
    llm = _llm(path)
    with pytest.raises(ValueError, match="max_num_seqs"):
        record_decode_step(llm, batch_size=9)
    with pytest.raises(ValueError, match="keep_args"):
        replay_times(record_decode_step(llm, 1))
    llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="idle engine"):
        record_decode_step(llm, 1)


def test_op_overhead_is_reported_per_operator():
    overhead = measure_op_overhead(reps=50, repeats=3)
    assert set(overhead) == {"add", "mul", "view", "linear", "to(float64)"}
    assert all(0 < t < 1e-2 for t in overhead.values())


def _classify(op, *args, **kwargs) -> bool:
    out = op(*args, **kwargs)
    return launches_kernel(op, args, kwargs, out)


def test_metadata_only_operators_are_told_from_computing_ones():
    aten = torch.ops.aten
    x = torch.arange(12.0).reshape(3, 4)
    # views, slices and casts to the dtype a tensor already has: no data written
    assert not _classify(aten.view.default, x, [4, 3])
    assert not _classify(aten.slice.Tensor, x, 1, 0, 2)
    assert not _classify(aten.transpose.int, x, 0, 1)
    assert not _classify(aten.reshape.default, x, [12])  # contiguous: a view
    assert not _classify(aten.to.dtype, x, torch.float32)
    assert not _classify(aten.empty.memory_format, [3, 4])
    # arithmetic, copies and in-place writes: each is a kernel on a GPU
    assert _classify(aten.add.Tensor, x, x)
    assert _classify(aten.to.dtype, x, torch.float64)  # a real conversion
    assert _classify(aten.reshape.default, x.t(), [12])  # not contiguous: reshape copies
    assert _classify(aten.add_.Tensor, x.clone(), 1.0)
    assert _classify(aten.mm.default, x, x.t())


def test_a_decode_step_counts_views_apart_from_kernels(tiny):
    name, path = tiny
    count = record_decode_step(_llm(path), batch_size=2)
    views = {"aten.view.default", "aten.slice.Tensor", "aten.transpose.int", "aten.select.int"}
    assert all(not r.launches_kernel for r in count.records if r.name in views)
    assert all(r.launches_kernel for r in count.records
               if r.name in {"aten.linear.default", "aten.rms_norm.default", "aten.embedding.default"})
    assert count.launching + count.metadata_only == count.total
    assert 0 < count.metadata_only < count.total

"""Graph buckets under a small token budget: a decode batch whose padded bucket has more rows than
``max_num_batched_tokens`` runs in a smaller bucket or eager, never overruns the static buffers, and gives
the eager engine's tokens (vLLM caps its capture sizes by the token budget the same way)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("budget"), "llama_gqa")
    return str(path)


def _tokens(model_dir, graph_mode, prompts, **kw):
    llm = LLM(model_dir, dtype="float32", device="cpu", attention_backend="torch", block_size=4,
              graph_mode=graph_mode, num_threads=1, **kw)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm.get_step_trace()


def test_three_rows_with_a_budget_of_three_tokens_run_like_eager(model_dir):
    prompts = [[5], [17], [33]]
    kw = dict(max_num_seqs=4, max_num_batched_tokens=3)
    compiled, trace = _tokens(model_dir, "compile", prompts, **kw)
    eager, _ = _tokens(model_dir, "none", prompts, **kw)
    assert compiled == eager
    # no step replayed a bucket with more rows than the budget holds
    assert all(t["bucket_size"] is None or t["bucket_size"] <= 3 for t in trace)


@pytest.mark.parametrize("max_num_seqs,budget,batch", [(4, 2, 4), (8, 5, 7)])
def test_batches_above_the_budget_bucket_give_the_eager_tokens(model_dir, max_num_seqs, budget, batch):
    prompts = [[3 + 5 * i] for i in range(batch)]
    kw = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    compiled, trace = _tokens(model_dir, "compile", prompts, **kw)
    eager, _ = _tokens(model_dir, "none", prompts, **kw)
    assert compiled == eager
    assert any(t["bucket_size"] for t in trace)  # some steps did replay a bucket that fits
    assert all(t["bucket_size"] is None or t["bucket_size"] <= budget for t in trace)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_num_seqs=st.integers(1, 5), budget=st.integers(1, 6), batch=st.integers(1, 5),
       seed=st.integers(0, 1000))
def test_any_budget_and_batch_gives_the_eager_tokens(model_dir, max_num_seqs, budget, batch, seed):
    prompts = [[(seed * 7 + 11 * i) % 90 + 3] for i in range(batch)]
    kw = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, cudagraph_capture_sizes=None)
    compiled, trace = _tokens(model_dir, "compile", prompts, **kw)
    eager, _ = _tokens(model_dir, "none", prompts, **kw)
    assert compiled == eager
    assert all(t["bucket_size"] is None or t["bucket_size"] <= budget for t in trace)

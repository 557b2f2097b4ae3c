"""The equality matrix, as vLLM tests async scheduling: on tiny fp32 models, every combination of graph
mode {none, compile} x async scheduling {off, on} x proposer {none, n-gram, draft model} — each with
chunked prefill (a small token budget), prefix caching on and preemption forced by a tiny pool — gives
the greedy tokens of the plain eager engine with a roomy pool. A combination that is not supported raises
a ValueError at construction. Seeded sampling gives the same tokens in eager and compile mode.

torch.compile takes seconds per bucket, so the compiled engines have a one-rung ladder ([2]) and k = 2.
"""

from __future__ import annotations

import itertools

import pytest
from test_spec_decode import _prompts, _run, _spec, pair  # noqa: F401

from minirunner import LLM, SamplingParams

K = 2
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
# A tiny pool (a long request alone needs 22 blocks of 4), a small token budget (chunked prefill),
# prefix caching on: every combination preempts, chunks and hits the cache.
TIGHT = dict(device="cpu", attention_backend="torch", block_size=4, num_kv_blocks=26, max_num_seqs=2,
             max_num_batched_tokens=16, enable_prefix_caching=True)
PROMPTS = 6
# Every combination is supported (README, "Async scheduling"): none is refused at construction.
SUPPORTED_ASYNC = set(itertools.product(["none", "compile"], ["none", "ngram", "draft_model"]))


def _engine(pair, graph_mode, async_scheduling, proposer, **extra):  # noqa: F811
    spec = None if proposer == "none" else _spec(pair, proposer, K)
    graphs = dict(cudagraph_capture_sizes=[2]) if graph_mode == "compile" else {}
    return LLM(pair["target"], graph_mode=graph_mode, async_scheduling=async_scheduling,
               speculative_config=spec, **graphs, **{**TIGHT, **extra})


@pytest.fixture(scope="module")
def reference(pair):  # noqa: F811
    plain = LLM(pair["target"], device="cpu", attention_backend="torch")  # eager, roomy pool
    return [o.outputs[0].token_ids for o in plain.generate(_prompts(PROMPTS), GREEDY, use_tqdm=False)]


COMBOS = list(itertools.product(["none", "compile"], [False, True], ["none", "ngram", "draft_model"]))


@pytest.mark.parametrize("graph_mode, async_scheduling, proposer", COMBOS,
                         ids=[f"{g}-{'async' if a else 'sync'}-{p}" for g, a, p in COMBOS])
def test_greedy_tokens_equal_the_plain_eager_engine(pair, reference, graph_mode, async_scheduling,  # noqa: F811
                                                     proposer):
    if async_scheduling and (graph_mode, proposer) not in SUPPORTED_ASYNC:
        with pytest.raises(ValueError, match="async_scheduling"):
            _engine(pair, graph_mode, async_scheduling, proposer)
        return
    llm = _engine(pair, graph_mode, async_scheduling, proposer)
    outputs = _run(llm, _prompts(PROMPTS), GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    trace = llm.get_step_trace()
    assert sum(t["num_preempted"] for t in trace) > 0, "the tiny pool was meant to preempt"
    assert any(t["num_prefill_tokens"] == TIGHT["max_num_batched_tokens"] for t in trace), "no chunk"
    assert sum(o.metrics.num_cached_prompt_tokens for o in outputs) > 0, "no prefix-cache hit"
    if graph_mode == "compile":
        assert any(t["graph"] == "compile" for t in trace), "no step replayed a compiled bucket"
    if async_scheduling:
        assert any(t["scheduled_ahead"] for t in trace), "no step was launched ahead"


@pytest.mark.parametrize("proposer", ["none", "ngram"])
def test_seeded_sampling_is_equal_in_eager_and_compile_mode(pair, proposer):  # noqa: F811
    params = [SamplingParams(temperature=0.9, top_k=40, seed=5 + i, max_tokens=12, ignore_eos=True)
              for i in range(PROMPTS)]
    got = {}
    for mode in ("none", "compile"):
        llm = _engine(pair, mode, False, proposer)
        got[mode] = [o.outputs[0].token_ids for o in _run(llm, _prompts(PROMPTS), params)]
    assert got["none"] == got["compile"]

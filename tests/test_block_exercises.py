"""The block-table twin and notebook 03's exercises against the real engine (a tiny random model).

The twin (``simulators.block_exercises``) predicts block ids, preemptions and cached tokens from the
rules alone; these tests run ``minirunner`` on the same scenarios and compare with its step trace.
"""

import pytest

from minirunner import LLM, SamplingParams
from simulators.block_exercises import (
    block_table_problem,
    cached_prompt_tokens,
    cached_tokens_problem,
    make_block_table_exercise,
    make_cached_tokens_exercise,
    make_preemption_exercise,
    preemption_problem,
    simulate_block_tables,
)
from tests.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("blocks"), "llama", vocab_size=128)
    return str(path)


def _run(model_dir, problem, **kw):
    llm = LLM(model_dir, dtype="float32", device="cpu", attention_backend="torch",
              block_size=problem["block_size"], num_kv_blocks=problem["num_blocks"],
              max_num_seqs=8, max_num_batched_tokens=256, trace_block_tables=True, **kw)
    prompts = [[3 + 10 * i + j for j in range(n)] for i, n in enumerate(problem["prompt_lens"])]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
              for m in problem["max_tokens"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return llm, [o.request_id for o in outputs]


def _compare(model_dir, problem):
    llm, rids = _run(model_dir, problem)
    trace = llm.get_step_trace()
    twin = simulate_block_tables(**problem)
    assert len(trace) == len(twin)
    for real, mine in zip(trace, twin, strict=True):
        assert real["request_ids"] == [rids[i] for i in mine.scheduled], real["step"]
        assert real["preempted_ids"] == [rids[i] for i in mine.preempted], real["step"]
        assert real["finished_ids"] == [rids[i] for i in mine.finished], real["step"]
        # the trace takes tables during the step (finished requests still hold theirs)
        assert real["block_tables"] == {rids[i]: t for i, t in mine.block_tables.items()}, real["step"]
        assert real["blocks_free"] == problem["num_blocks"] - sum(map(len, mine.block_tables.values()))
        assert real["blocks_used_after"] == problem["num_blocks"] - mine.blocks_free
    return twin


@pytest.mark.parametrize("seed", range(4))
def test_twin_predicts_the_engines_block_tables(model_dir, seed):
    _compare(model_dir, block_table_problem(seed))


@pytest.mark.parametrize("seed", range(4))
def test_twin_predicts_the_engines_preemptions(model_dir, seed):
    twin = _compare(model_dir, preemption_problem(seed))
    assert any(s.preempted for s in twin)


@pytest.mark.parametrize("seed", range(6))
def test_cached_token_count_matches_the_engine(model_dir, seed):
    p = cached_tokens_problem(seed)
    llm = LLM(model_dir, dtype="float32", device="cpu", attention_backend="torch",
              block_size=p["block_size"], num_kv_blocks=64, enable_prefix_caching=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate([p["first"]], greedy, use_tqdm=False)
    second = llm.generate([p["second"]], greedy, use_tqdm=False)[0]
    expected = cached_prompt_tokens(p["first"], p["second"], p["block_size"])
    assert second.metrics.num_cached_prompt_tokens == expected
    assert make_cached_tokens_exercise(seed).solution() == expected


@pytest.mark.parametrize("maker", [make_block_table_exercise, make_preemption_exercise,
                                   make_cached_tokens_exercise], ids=lambda m: m.__name__)
def test_exercises_check_themselves_and_explain(maker):
    for seed in range(8):
        ex = maker(seed)
        assert ex.check(ex.solution()).correct
        assert str(ex.check(None)).startswith("not answered yet")
        assert ex.question == maker(seed).question
    ex = make_preemption_exercise(0)
    rid, step = ex.solution()
    assert "most recently admitted" in ex.check((rid + 1, step)).why
    ex = make_block_table_exercise(2)
    assert "ceil" in ex.check(ex.solution() + [99]).why


def test_twin_rejects_impossible_scenarios():
    with pytest.raises(ValueError, match="bigger pool"):
        simulate_block_tables([10], [10], 4, 2)
    with pytest.raises(ValueError, match="one max_tokens"):
        simulate_block_tables([1, 2], [1], 4, 8)

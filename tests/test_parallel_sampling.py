"""n > 1: the n completions share the prompt's blocks by reference count, copy a shared partly filled
block on first write, are seeded distinctly and reproducibly, and each equals the single request run
with its derived seed (so the copied K/V is right)."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.engine.parallel_sampling import child_seed

PROMPT = [5, 17, 33, 8, 61, 2, 40, 9, 11, 70, 3]  # 11 tokens: the third 4-token block is partial
BLOCK = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("parallel"), "qwen3")
    return path


def _llm(model_dir, **kw):
    return LLM(str(model_dir), dtype="float32", device="cpu", attention_backend="torch",
               block_size=BLOCK, trace_block_tables=True, **kw)


def _peak_blocks(llm):
    return max(t["blocks_used"] for t in llm.get_step_trace())


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_n4_shares_prompt_blocks_and_matches_separate_requests(model_dir, prefix_caching):
    llm = _llm(model_dir, enable_prefix_caching=prefix_caching)
    params = SamplingParams(n=4, temperature=1.0, seed=21, max_tokens=9, ignore_eos=True)
    out = llm.generate([PROMPT], params, use_tqdm=False)[0]
    llm.engine.kv.check_invariants()
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    tokens = [tuple(c.token_ids) for c in out.outputs]
    assert len(set(tokens)) == 4, "each completion is seeded differently"
    # Reproducible: the same call gives the same four completions.
    again = llm.generate([PROMPT], params, use_tqdm=False)[0]
    assert [tuple(c.token_ids) for c in again.outputs] == tokens
    # Each completion equals a lone request with the derived seed: the shared and copied K/V is right.
    for i, c in enumerate(out.outputs):
        lone = SamplingParams(temperature=1.0, seed=child_seed(21, i), max_tokens=9, ignore_eos=True)
        assert llm.generate([PROMPT], lone, use_tqdm=False)[0].outputs[0].token_ids == c.token_ids

    fresh = _llm(model_dir, enable_prefix_caching=prefix_caching)
    fresh.generate([PROMPT], params, use_tqdm=False)
    trace = fresh.get_step_trace()
    with_four = [list(t["block_tables"].values()) for t in trace if len(t["block_tables"]) == 4]
    # Right after the fork all four hold the same three prompt blocks, the partial one included ...
    assert len({tuple(t[:3]) for t in with_four[0]}) == 1
    # ... and once each has written, the full blocks are still shared, the partial one was copied.
    last = with_four[-1]
    assert len({tuple(t[:2]) for t in last}) == 1, "the two full prompt blocks are shared"
    assert len({t[2] for t in last}) == 4, "the partly filled block was copied on first write"
    separate = _llm(model_dir)  # four separate requests, nothing shared
    separate.generate([PROMPT] * 4, SamplingParams(temperature=1.0, seed=21, max_tokens=9,
                                                   ignore_eos=True), use_tqdm=False)
    assert _peak_blocks(fresh) < _peak_blocks(separate)


def test_n_with_a_prompt_ending_on_a_block_boundary_and_preemption(model_dir):
    prompt = PROMPT[:8]  # two full blocks
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=14, ignore_eos=True)
    roomy = _llm(model_dir).generate([prompt], params, use_tqdm=False)[0]
    tight = _llm(model_dir, num_kv_blocks=9, max_model_len=24)
    out = tight.generate([prompt], params, use_tqdm=False)[0]
    assert sum(t["num_preempted"] for t in tight.get_step_trace()) > 0
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in roomy.outputs]
    assert tight.engine.block_pool.num_free_blocks == 9
    tight.engine.kv.check_invariants()


def test_n_streams_every_completion_and_aborts_all(model_dir):
    llm = _llm(model_dir)
    params = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=6, ignore_eos=True)
    expected = llm.generate([PROMPT], params, use_tqdm=False)[0]
    seen = {0: [], 1: [], 2: []}
    finals = []
    for chunk in llm.stream([PROMPT], params):
        seen[chunk.output_index] += chunk.new_token_ids
        if chunk.output is not None:
            finals.append(chunk.output)
    assert [seen[i] for i in range(3)] == [c.token_ids for c in expected.outputs]
    assert len(finals) == 1 and len(finals[0].outputs) == 3
    engine = llm.engine
    rid = engine.add_request(PROMPT, params)
    engine.step()
    engine.step()
    engine.abort_request(rid)
    assert not engine.has_unfinished_requests()
    out = engine.pop_finished(rid)
    assert [c.finish_reason for c in out.outputs] == ["abort"] * 3
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks

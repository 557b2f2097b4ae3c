"""One request's sampling options cost its own row only (issue 53): the compiled step runs the forward and
the plain sampler, and the rows that need more (logprobs, penalties) are handled after the forward, per
row. In a batch of 8 compiled decode rows where one request asks for logprobs and another has a
frequency penalty, the steps stay compiled, the other requests are still speculated (n-gram, k = 3; the
two are verified with k = 0 in the same step), and every output equals the same request run alone.
"""

from __future__ import annotations

import pytest
from test_spec_decode import _prompts, _spec, pair  # noqa: F401  (pair is a fixture)

from minirunner import LLM, SamplingParams

K = 3


@pytest.fixture(scope="module")
def compiled(pair):  # noqa: F811
    return LLM(pair["target"], speculative_config=_spec(pair, "ngram", K), graph_mode="compile",
               cudagraph_capture_sizes=[8], device="cpu", attention_backend="torch", block_size=4,
               max_num_seqs=8)


def _params():
    base = dict(temperature=0, max_tokens=12, ignore_eos=True)
    params = [SamplingParams(**base) for _ in range(8)]
    params[2] = SamplingParams(**base, logprobs=5)
    params[5] = SamplingParams(**base, frequency_penalty=0.5)
    return params


def test_logprobs_and_a_penalty_keep_the_batch_compiled_and_speculated(compiled):
    prompts, params = _prompts(8, seed=5), _params()
    alone = [compiled.generate([p], sp, use_tqdm=False)[0] for p, sp in zip(prompts, params, strict=True)]
    compiled.clear_step_trace()
    together = compiled.generate(prompts, params, use_tqdm=False)
    trace = compiled.get_step_trace()

    for a, t in zip(alone, together, strict=True):
        assert t.outputs[0].token_ids == a.outputs[0].token_ids
    lp_alone, lp_together = alone[2].outputs[0].logprobs, together[2].outputs[0].logprobs
    assert len(lp_together) == len(together[2].outputs[0].token_ids)
    for want, got in zip(lp_alone, lp_together, strict=True):
        assert set(want) == set(got) and len(got) >= 5
        assert all(abs(want[tok].logprob - got[tok].logprob) < 1e-4 for tok in want)

    special = {together[2].request_id, together[5].request_id}
    full = [t for t in trace if len(t["request_ids"]) == 8 and not t["num_prefill_tokens"]]
    assert full, "no step ran the whole batch in decode"
    assert all(t["graph"] == "compile" for t in full), [(t["graph"], t["eager_reason"]) for t in full]
    verify = [t for t in full if t["num_draft_tokens"]]
    assert verify, "the batch was not speculated"
    for t in verify:
        assert not special & set(t["spec_runs"]), "a request that needs its own sampling got drafts"
        assert all(k <= K for k, _ in t["spec_runs"].values())
    assert any(k == K for t in verify for k, _ in t["spec_runs"].values())


def test_eager_steps_say_why(compiled):
    compiled.clear_step_trace()
    compiled.generate(_prompts(2, seed=9), SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    reasons = {t["eager_reason"] for t in compiled.get_step_trace() if t["graph"] != "compile"}
    assert "prefill" in reasons


def test_the_device_input_path_pads_the_same_rows(compiled):
    # The GPU-native input path (the input-prep kernel's torch twin on a CPU) pads the requests with
    # fewer drafts inside their rows too: same tokens, same compiled steps.
    prompts, params = _prompts(8, seed=5), _params()
    want = [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)]
    runner = compiled.engine.runner
    runner.set_input_prep("device")
    try:
        compiled.clear_step_trace()
        got = [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)]
    finally:
        runner.set_input_prep("host")
    assert got == want
    trace = compiled.get_step_trace()
    full = [t for t in trace if len(t["request_ids"]) == 8 and not t["num_prefill_tokens"]]
    assert full and all(t["graph"] == "compile" for t in full)
    assert any(t["num_draft_tokens"] for t in full)

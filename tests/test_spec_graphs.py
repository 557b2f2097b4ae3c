"""Speculative decoding under graph_mode="compile" on a CPU: the uniform verify step (every request at
k + 1 query tokens) runs as one compiled bucket with the rejection sampler inside it, and gives the
tokens of eager verification: greedy (equal to plain greedy decoding) and seeded sampling (equal to the
eager speculative run), with the draft model's q from the static buffer and with one-hot n-gram drafts,
padded rows included. The draft model's one-token passes replay their own compiled buckets.

torch.compile takes seconds per bucket, so each engine has a one-rung ladder ([2]) and k = 2.
"""

from __future__ import annotations

import pytest
from test_spec_decode import _prompts, _spec, pair  # noqa: F401  (pair is a fixture)

from minirunner import LLM, SamplingParams
from minirunner.worker.cudagraph import GraphKey, GraphKind

K = 2
COMMON = dict(device="cpu", attention_backend="torch", block_size=4, max_num_seqs=2)


def _tokens(llm, prompts, params):
    llm.clear_step_trace()
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _verify_replays(llm):
    return [t for t in llm.get_step_trace() if t["graph"] == "compile" and t["num_draft_tokens"]]


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_compiled_verify_step_gives_the_eager_tokens(pair, method):  # noqa: F811
    prompts = _prompts(5)  # 5 requests through a 2-row bucket: batches of 2 and a padded batch of 1
    spec = _spec(pair, method, K)
    compiled = LLM(pair["target"], speculative_config=spec, graph_mode="compile",
                   cudagraph_capture_sizes=[2], **COMMON)
    eager = LLM(pair["target"], speculative_config=spec, **COMMON)
    plain = LLM(pair["target"], **COMMON)

    greedy = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    assert _tokens(compiled, prompts, greedy) == _tokens(plain, prompts, greedy)
    replays = _verify_replays(compiled)
    assert replays, "no verify step ran as a compiled bucket"
    assert any(t["num_padded_rows"] == 1 for t in replays), "no padded verify replay"
    assert all(t["bucket_size"] == 2 for t in replays)
    # greedy drafts carry one-hot q (a greedy draft pass takes the argmax): the one-hot verify kind
    assert GraphKey(2, GraphKind.VERIFY_ONEHOT, K + 1) in compiled.engine.runner.graphs.keys()
    if method == "draft_model":  # the draft's one-token passes replay too
        draft = compiled.engine.runner.drafter.proposer
        assert GraphKey(2, GraphKind.GREEDY) in draft.graphs.keys()

    # Sampling: noise keyed by (seed, position) makes the compiled run's tokens those of eager.
    sampled = SamplingParams(temperature=0.9, seed=7, max_tokens=14, ignore_eos=True)
    assert _tokens(compiled, prompts, sampled) == _tokens(eager, prompts, sampled)
    assert _verify_replays(compiled)
    if method == "draft_model":  # sampled drafts: q from the static buffer
        assert GraphKey(2, GraphKind.VERIFY, K + 1) in compiled.engine.runner.graphs.keys()

"""Drafts are proposed inside ``ModelRunner.execute``, after sampling: they come back in the step's
RunnerOutput as data, they are what the proposer makes of the tokens just sampled, and the scheduler
schedules exactly them in the next step. Sync and async scheduling give the same tokens."""

from __future__ import annotations

import pytest
from test_spec_decode import _prompts, _spec, pair  # noqa: F401

from minirunner import LLM, SamplingParams
from minirunner.spec_decode.ngram import ngram_propose

K = 3
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
ROOMY = dict(device="cpu", attention_backend="torch", max_num_batched_tokens=512)


def _steps(llm, prompts, params):
    """Drive the engine; per step: (the scheduler's data, the runner's output, the live requests)."""
    engine, seen = llm.engine, []
    schedule = engine.scheduler.schedule

    def record(*args):
        step = schedule(*args)
        seen.append(step.output)
        return step

    engine.scheduler.schedule = record
    for p in prompts:
        engine.add_request(p, params)
    steps = []
    while engine.has_unfinished_requests():
        before = len(seen)
        out = engine.execute_step().runner_output
        # each live request as it stands after this step: (num_tokens, token ids, max_len)
        live = {r.request_id: (r.num_tokens, list(r.all_token_ids), r.max_len)
                for r in engine.scheduler.running}
        steps.append((seen[before] if len(seen) > before else None, out, live))
    return steps


def test_ngram_drafts_come_back_as_data_and_are_scheduled_next(pair):  # noqa: F811
    llm = LLM(pair["target"], speculative_config=_spec(pair, "ngram", K), **ROOMY)
    steps = _steps(llm, _prompts(4), GREEDY)
    drafted = 0
    for (_, out, live), (nxt, _, _) in zip(steps, steps[1:] + [(None, None, None)], strict=True):
        if out is None:
            continue
        for rid, drafts in out.draft_token_ids.items():
            if rid not in live:
                continue  # finished by this step's tokens
            num_tokens, token_ids, max_len = live[rid]
            k = min(K, max_len - num_tokens - 1)
            # what the proposer makes of the request's tokens, the one just sampled last
            assert drafts == ngram_propose(token_ids, k, 1, 3)
            assert nxt.scheduled_spec_decode_tokens.get(rid) == drafts
            drafted += 1
    assert drafted > 0, "the prompts repeat phrases: n-gram should draft"


def test_draft_model_drafts_are_its_greedy_continuation_and_are_scheduled_next(pair):  # noqa: F811
    # the draft is the target itself: its greedy drafts are the tokens the target emits next
    llm = LLM(pair["target"], speculative_config=_spec(pair, "draft_model", K, draft="same"), **ROOMY)
    steps = _steps(llm, _prompts(3), GREEDY)
    drafted = 0
    outputs = {r.request_id: r for r in llm.engine.requests.values()}
    for (_, out, live), (nxt, _, _) in zip(steps, steps[1:] + [(None, None, None)], strict=True):
        if out is None:
            continue
        for rid, drafts in out.draft_token_ids.items():
            if rid not in live:
                continue
            n = live[rid][0]
            assert drafts == outputs[rid].all_token_ids[n:n + len(drafts)]
            assert nxt.scheduled_spec_decode_tokens.get(rid) == drafts
            drafted += 1
    assert drafted > 0


@pytest.mark.parametrize("proposer", ["ngram", "draft_model"])
def test_sync_and_async_speculation_give_the_same_tokens(pair, proposer):  # noqa: F811
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True)
    tokens = []
    for async_scheduling in (False, True):
        llm = LLM(pair["target"], speculative_config=_spec(pair, proposer, K),
                  async_scheduling=async_scheduling, **ROOMY)
        outs = llm.generate(_prompts(4), params, use_tqdm=False)
        tokens.append([o.outputs[0].token_ids for o in outs])
    assert tokens[0] == tokens[1]


def test_a_prefill_chunk_one_token_short_is_followed_by_drafts(pair):  # noqa: F811
    prompt = [5, 6, 7, 8] * 4 + [5]  # 17 tokens: a budget of 16 leaves the last one for the next step
    llm = LLM(pair["target"], speculative_config=_spec(pair, "ngram", K),
              **{**ROOMY, "max_num_batched_tokens": 16})
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    steps = _steps(llm, [prompt], params)
    (first, out, _), (second, _, _) = steps[0], steps[1]
    assert list(first.num_scheduled_tokens.values()) == [16] and not out.req_ids  # nothing sampled yet
    rid = next(iter(first.num_scheduled_tokens))
    drafts = out.draft_token_ids[rid]
    assert drafts == ngram_propose(prompt, K, 1, 3) == [6, 7, 8]
    assert second.scheduled_spec_decode_tokens == {rid: drafts}
    plain = LLM(pair["target"], **ROOMY)
    spec = LLM(pair["target"], speculative_config=_spec(pair, "ngram", K),
               **{**ROOMY, "max_num_batched_tokens": 16})
    got = spec.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == plain.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids


def test_a_request_the_step_ends_gets_no_drafts(pair):  # noqa: F811
    prompts = _prompts(4)
    plain = LLM(pair["target"], **ROOMY).generate(prompts, GREEDY, use_tqdm=False)
    stop_ids = sorted({o.outputs[0].token_ids[2] for o in plain})  # each request stops by the third token
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=stop_ids)
    llm = LLM(pair["target"], speculative_config=_spec(pair, "ngram", K), **ROOMY)
    ended = 0
    for _, out, live in _steps(llm, prompts, params):
        if out is None:
            continue
        for rid in out.req_ids:
            if rid not in live:  # ended by this step's tokens (a stop id): nothing to verify after it
                ended += 1
                assert rid not in out.draft_token_ids
    assert ended == len(prompts)

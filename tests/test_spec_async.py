"""Speculative steps scheduled one step ahead (async_scheduling=True: a draft model proposes on the device
after each verify replay, spec_decode/draft_passes.py, and a steady batch's next verify step is launched
before the host reads the last) on a CPU under graph_mode="compile": the tokens are
the synchronous engine's (greedy: plain greedy decoding; seeded sampling: the synchronous speculative
run) with stops that land one step late, a tiny KV budget (preemption), prefix caching and an abort in
the middle of a run; both pools stay consistent and are empty at the end; unverified tokens never enter
the prefix cache.

torch.compile takes seconds per bucket, so the engines have a one-rung ladder ([2]) and k = 2.
"""

from __future__ import annotations

import pytest
from test_spec_decode import _cached_hashes_are_verified, _prompts, _run, _spec, pair  # noqa: F401

from minirunner import LLM, SamplingParams

K = 2
COMMON = dict(device="cpu", attention_backend="torch", block_size=4, max_num_seqs=2)


def _async(pair, **extra):  # noqa: F811
    return LLM(pair["target"], speculative_config=_spec(pair, "draft_model", K), graph_mode="compile",
               cudagraph_capture_sizes=[2], async_scheduling=True, **{**COMMON, **extra})


@pytest.fixture(scope="module")
def ahead(pair):  # noqa: F811
    return _async(pair, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def sync(pair):  # noqa: F811
    return LLM(pair["target"], speculative_config=_spec(pair, "draft_model", K), **COMMON)


def _ahead_steps(llm):
    """The speculative steps that replayed a verify bucket while another step was in flight."""
    return [t for t in llm.get_step_trace()
            if t["scheduled_ahead"] and t["num_draft_tokens"] and t["graph"] == "compile"]


def _stopping_params(prompts, sync, temperature):
    """Per-prompt params whose stops land inside the runs: max_tokens of different lengths, and a stop
    token id taken from the middle of the synchronous output (so the request stops there)."""
    params = []
    for i, p in enumerate(prompts):
        base = SamplingParams(temperature=temperature, seed=11 + i, max_tokens=12 + 3 * i,
                              ignore_eos=True)
        out = sync.generate([p], base, use_tqdm=False)[0].outputs[0].token_ids
        stop = [out[7 + i % 3]] if i % 2 else []
        params.append(SamplingParams(temperature=temperature, seed=11 + i, max_tokens=12 + 3 * i,
                                     ignore_eos=True, stop_token_ids=stop))
    return params


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_steps_scheduled_ahead_give_the_synchronous_tokens(pair, ahead, sync, temperature):  # noqa: F811
    prompts = _prompts(6)
    params = _stopping_params(prompts, sync, temperature)
    sync_outputs = sync.generate(prompts, params, use_tqdm=False)
    ahead.clear_step_trace()
    ahead_outputs = _run(ahead, prompts, params)
    got, want = [o.outputs[0] for o in ahead_outputs], [o.outputs[0] for o in sync_outputs]
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    # the same drafts were proposed and accepted (greedy tokens alone cannot tell a wrong draft)
    counts = ("num_steps", "num_draft_tokens", "num_accepted_tokens")
    assert [[o.metrics.spec_decode[c] for c in counts] for o in ahead_outputs] \
        == [[o.metrics.spec_decode[c] for c in counts] for o in sync_outputs]
    steps = _ahead_steps(ahead)
    assert len(steps) >= 10, "too few steps were scheduled ahead for the test to mean anything"
    assert any(t["num_padded_rows"] for t in steps), "no step ahead ran a padded bucket"
    # some request stopped at a step whose successor was already launched (the one-step-late drain)
    assert any(t["finished_ids"] for t in steps)
    engine = ahead.engine
    assert engine.block_pool.num_used_blocks == 0  # the draft's K/V lives in the target's blocks
    assert engine.pending is None


def test_greedy_ahead_is_lossless_with_preemption_and_prefix_caching(pair):  # noqa: F811
    prompts = _prompts(8)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(pair["target"], **COMMON)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy, use_tqdm=False)]
    tiny = _async(pair, enable_prefix_caching=True, num_kv_blocks=26)
    outputs = _run(tiny, prompts, greedy)
    assert [o.outputs[0].token_ids for o in outputs] == want
    trace = tiny.get_step_trace()
    assert sum(t["num_preempted"] for t in trace) > 0, "the KV budget forced no preemption"
    assert _ahead_steps(tiny)
    _cached_hashes_are_verified(tiny.engine, outputs)


def test_abort_while_a_step_is_in_flight_keeps_the_others_and_frees_everything(ahead, sync):
    prompts = _prompts(2, seed=5)
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    want = sync.generate([prompts[1]], greedy, use_tqdm=False)[0].outputs[0].token_ids
    engine = ahead.engine
    ids = [engine.add_request(p, greedy) for p in prompts]
    while engine.pending is None:
        engine.step()
    engine.abort_request(ids[0])
    while engine.has_unfinished_requests():
        engine.step()
        engine.kv.check_invariants()
    assert engine.pop_finished(ids[0]).outputs[0].finish_reason == "abort"
    assert engine.pop_finished(ids[1]).outputs[0].token_ids == want
    assert engine.block_pool.num_used_blocks == 0


def test_synchronous_graph_steps_propose_on_the_device_with_the_host_proposers_drafts(pair, sync):  # noqa: F811
    """The synchronous engine under graphs runs the same device passes (sync and async speculation are
    one code path) and reads the drafts back: same tokens, drafts and acceptances as the eager engine,
    whose draft model proposes from the tokens it reads."""
    graphs = LLM(pair["target"], speculative_config=_spec(pair, "draft_model", K), graph_mode="compile",
                 cudagraph_capture_sizes=[2], **COMMON)
    prompts = _prompts(4, seed=9)
    params = [SamplingParams(temperature=t, seed=5 + i, max_tokens=20, ignore_eos=True)
              for i, t in enumerate((0.0, 0.9, 0.0, 0.9))]
    want = sync.generate(prompts, params, use_tqdm=False)
    got = graphs.generate(prompts, params, use_tqdm=False)
    counts = ("num_steps", "num_draft_tokens", "num_accepted_tokens")
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert [[o.metrics.spec_decode[c] for c in counts] for o in got] \
        == [[o.metrics.spec_decode[c] for c in counts] for o in want]
    assert graphs.engine.runner.drafter.passes.num_graph_launches > 0, "no step proposed on the device"
    assert not any(t["scheduled_ahead"] for t in graphs.get_step_trace())  # nothing runs ahead in sync

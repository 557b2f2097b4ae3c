"""Async scheduling of plain decode (async_scheduling=True, no speculative decoding): step N + 1 is
launched before step N's tokens are read, the token each request sampled at step N is fed to step N + 1
on the device, stop checks run one step late and a finished request's extra step is discarded. Whatever
a request asks for, its output equals the synchronous engine's: greedy and seeded tokens, logprobs,
prompt logprobs, n > 1 completions, stop strings and ids, penalties and min_tokens, under preemption
(a tiny pool), chunked prefill and prefix caching; an abort while a step is in flight; streaming.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_spec_decode import _cached_hashes_are_verified, _prompts, _run, pair  # noqa: F401
from tiny_models import add_tokenizer

from minirunner import LLM, SamplingParams

TIGHT = dict(device="cpu", attention_backend="torch", block_size=4, num_kv_blocks=30, max_num_seqs=3,
             max_num_batched_tokens=16, enable_prefix_caching=True)


def _llm(pair, async_scheduling, **extra):  # noqa: F811
    return LLM(pair["target"], async_scheduling=async_scheduling, **{**TIGHT, **extra})


class _Single:
    """One completion of an output, shaped as ``_cached_hashes_are_verified`` reads an output."""

    def __init__(self, output, completion):
        self.prompt_token_ids, self.outputs = output.prompt_token_ids, [completion]


def _fields(outputs):
    """What a user reads of each output, logprobs apart (``_logprobs``)."""
    return [(c.index, c.token_ids, c.text, c.finish_reason, c.stop_reason)
            for o in outputs for c in o.outputs]


def _logprobs(outputs):
    """Every sampled and prompt logprob as (token, value) pairs in order. The batches of the two
    engines differ (a step launched ahead runs beside other requests), so values agree to float
    rounding, not bit for bit."""
    rows = []
    for o in outputs:
        for d in [*(o.prompt_logprobs or []), *(lp for c in o.outputs for lp in (c.logprobs or []))]:
            rows += [] if d is None else sorted((t, v.logprob) for t, v in d.items())
    return rows


def _assert_same_logprobs(got, want):
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-5)


@pytest.fixture(scope="module")
def tokenized(pair):  # noqa: F811
    add_tokenizer(Path(pair["target"]))
    return pair


def _mixed_params(n):
    """A request of every kind: greedy, seeded top-k/top-p, n = 2, logprobs, prompt logprobs,
    penalties (host-side logits processors), min_tokens, a stop token id."""
    kinds = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.9, top_k=30, top_p=0.9, seed=7, max_tokens=18, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=14, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=10, prompt_logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=9, presence_penalty=0.5, repetition_penalty=1.2,
                       max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0, min_tokens=6, max_tokens=12, stop_token_ids=[5, 17, 40]),
    ]
    return [kinds[i % len(kinds)] for i in range(n)]


@pytest.mark.parametrize("graph_mode", ["none", "compile"])
def test_async_outputs_equal_the_synchronous_engine(pair, graph_mode):  # noqa: F811
    prompts = _prompts(10)
    params = _mixed_params(len(prompts))
    graphs = dict(graph_mode=graph_mode, cudagraph_capture_sizes=[2]) if graph_mode == "compile" else {}
    sync = _llm(pair, False, **graphs)
    expected = sync.generate(prompts, params, use_tqdm=False)
    want, want_logprobs = _fields(expected), _logprobs(expected)
    ahead = _llm(pair, True, **graphs)
    outputs = _run(ahead, prompts, params)
    assert _fields(outputs) == want
    _assert_same_logprobs(_logprobs(outputs), want_logprobs)
    assert len(want_logprobs) > 100
    trace = ahead.get_step_trace()
    assert sum(t["num_preempted"] for t in trace) > 0, "the tiny pool was meant to preempt"
    assert sum(t["scheduled_ahead"] for t in trace) > len(trace) // 3, "few steps were launched ahead"
    if graph_mode == "compile":
        assert any(t["graph"] == "compile" and t["scheduled_ahead"] for t in trace)
    # penalties count on the device: a step with the penalised request in it still runs ahead
    penalised = outputs[5].request_id
    assert any(t["scheduled_ahead"] and penalised in t["request_ids"] for t in trace)
    engine = ahead.engine
    assert engine.pending is None and engine.block_pool.num_used_blocks == 0
    # every cached block holds a full block of some completion's tokens (never a token still in flight)
    _cached_hashes_are_verified(engine, [_Single(o, c) for o in outputs for c in o.outputs])


def test_a_stop_lands_one_step_late_and_the_extra_step_is_discarded(tokenized):
    """Stop strings, stop ids and max_tokens: the request stops at the same token as the synchronous
    engine, though the step after it had already been launched (its token is never appended)."""
    prompts = _prompts(6, seed=3)
    sync = _llm(tokenized, False)
    base = sync.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                         use_tqdm=False)
    params = []
    for i, o in enumerate(base):
        c = o.outputs[0]
        if i % 3 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=24, stop=[c.text[6:9]]))
        elif i % 3 == 1:
            params.append(SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[c.token_ids[9]]))
        else:
            params.append(SamplingParams(temperature=0, max_tokens=7 + i, ignore_eos=True))
    want = _fields(sync.generate(prompts, params, use_tqdm=False))
    ahead = _llm(tokenized, True)
    got = _fields(_run(ahead, prompts, params))
    assert got == want
    assert {row[3] for row in want} == {"stop", "length"}
    # some request finished in a step whose successor was already launched for it
    trace = ahead.get_step_trace()
    late = [(t, u) for t, u in zip(trace, trace[1:], strict=False)
            if set(t["finished_ids"]) & set(u["request_ids"])]
    assert late, "no stop landed while the next step was in flight"


def test_abort_while_a_step_is_in_flight(pair):  # noqa: F811
    prompts = _prompts(3, seed=5)
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in _llm(pair, False).generate(prompts, greedy, use_tqdm=False)]
    engine = _llm(pair, True).engine
    ids = [engine.add_request(p, greedy) for p in prompts]
    while engine.pending is None or not engine.requests[ids[1]].output_token_ids:
        engine.step()
    engine.abort_request(ids[1])
    while engine.has_unfinished_requests():
        engine.step()
        engine.kv.check_invariants()
    assert engine.pop_finished(ids[1]).outputs[0].finish_reason == "abort"
    assert [engine.pop_finished(ids[i]).outputs[0].token_ids for i in (0, 2)] == [want[0], want[2]]
    assert engine.block_pool.num_used_blocks == 0


def test_streaming_deltas_add_up_to_the_synchronous_text(tokenized):
    prompts = _prompts(4, seed=2)
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=16, ignore_eos=True)
    want = [o.outputs[0].text for o in _llm(tokenized, False).generate(prompts, params, use_tqdm=False)]
    texts = ["" for _ in prompts]
    for chunk in _llm(tokenized, True).stream(prompts, params):
        texts[chunk.index] += chunk.new_text
    assert texts == want


def test_async_on_the_device_input_path_equals_the_synchronous_host_path(pair):  # noqa: F811
    """The GPU-native input path (forced here, on a CPU: the input-prep kernel's twin) with steps launched
    ahead: the token in flight is gathered on the device after the kernel filled the step's buffers."""
    prompts = _prompts(8, seed=9)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=4, max_tokens=16, ignore_eos=True)
    want = _fields(_llm(pair, False).generate(prompts, params, use_tqdm=False))
    ahead = _llm(pair, True)
    ahead.engine.runner.set_input_prep("device")
    assert _fields(_run(ahead, prompts, params)) == want
    assert any(t["scheduled_ahead"] for t in ahead.get_step_trace())

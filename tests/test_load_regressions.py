"""Correctness under load, one test per reported failure: a livelock of n > 1 under memory pressure,
logits processors and logprobs skipped for a request that joins a speculative step, a default KV budget
one block short, and n larger than max_num_seqs."""

from __future__ import annotations

import contextlib
import signal

import pytest
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.engine.parallel_sampling import child_seed


@contextlib.contextmanager
def deadline(seconds: int):
    """Turn a generate that never returns into a failure (SIGALRM interrupts the loop)."""
    def expire(signum, frame):
        raise TimeoutError(f"generate did not return within {seconds} s: a livelock")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny Llama (vocab 96, hidden 64, 2 layers, 8 heads, 2 KV heads) and an exact copy of it as
    the draft model, so every step drafts."""
    root = tmp_path_factory.mktemp("load")
    target_dir, model = make_tiny_model(root, "llama_gqa", seed=1)
    model.save_pretrained(root / "draft", safe_serialization=True)
    return dict(target=str(target_dir), draft=str(root / "draft"))


def _llm(dirs, **kw):
    return LLM(dirs["target"], dtype="float32", device="cpu", attention_backend="torch", num_threads=1,
               **kw)


def _spec(dirs, method):
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                "prompt_lookup_max": 2}
    return {"method": "draft_model", "model": dirs["draft"], "num_speculative_tokens": 3}


P13 = [5, 17, 33, 8, 61, 12, 40, 9, 11, 70, 3, 44, 19]
P9 = [7, 21, 55, 13, 80, 6, 31, 47, 25]


@pytest.mark.parametrize("spec", [None, "ngram", "draft_model"])
def test_forked_children_waiting_for_a_seat_do_not_livelock_a_small_pool(dirs, spec):
    """Case 1: completion 1 of the n=2 request waits with the prompt's blocks while the 13-token request
    needs the whole pool; generate must finish, with the tokens a roomy pool gives (without
    speculation; with it, the greedy request's)."""
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=20, ignore_eos=True)]
    extra = {} if spec is None else {"speculative_config": _spec(dirs, spec)}
    roomy = _llm(dirs, block_size=4, num_kv_blocks=64, max_num_seqs=2, **extra)
    want = [[c.token_ids for c in o.outputs] for o in roomy.generate([P13, P9], params, use_tqdm=False)]
    tiny = _llm(dirs, block_size=4, num_kv_blocks=11, max_num_seqs=2, **extra)
    with deadline(30):
        got = tiny.generate([P13, P9], params, use_tqdm=False)
    got = [[c.token_ids for c in o.outputs] for o in got]
    if spec is None:
        assert got == want
    else:  # sampled tokens depend on which drafts a step verified; greedy ones never do
        assert got[0] == want[0] and [len(t) for t in got[1]] == [20, 20]
    assert sum(t["num_preempted"] for t in tiny.get_step_trace()) > 0, "the pool never ran dry"
    tiny.engine.kv.check_invariants()
    assert tiny.engine.block_pool.num_free_blocks == 11, "a finished request kept blocks"


def _drive(llm, first, late, late_params, steps_before: int):
    """Run ``first`` (greedy, drafting) alone for a few steps, then add ``late``; returns late's output."""
    engine = llm.engine
    a = engine.add_request(first, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(steps_before):
        engine.step()
    b = engine.add_request(late, late_params)
    with deadline(30):
        while engine.has_unfinished_requests():
            engine.step()
    engine.pop_finished(a)
    return engine.pop_finished(b)


REPEAT = [4, 9, 4, 9, 4, 9, 4, 9, 4, 9]  # n-gram lookup always finds a continuation


@pytest.mark.parametrize("spec", ["ngram", "draft_model"])
def test_a_request_admitted_into_a_drafting_step_gets_its_logits_processors(dirs, spec):
    """Case 2: logit_bias and min_tokens apply to the first token of a request admitted while another
    drafts: its output equals the one without speculation."""
    plain = _llm(dirs)
    argmax = plain.generate([P9], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0] \
        .outputs[0].token_ids[0]
    cases = [SamplingParams(temperature=0, max_tokens=6, logit_bias={argmax: -100.0}),
             SamplingParams(temperature=0, max_tokens=6, min_tokens=4, stop_token_ids=[argmax])]
    for params in cases:
        want = _drive(_llm(dirs), REPEAT, P9, params, 6).outputs[0]
        llm = _llm(dirs, speculative_config=_spec(dirs, spec))
        got = _drive(llm, REPEAT, P9, params, 6).outputs[0]
        assert llm.get_spec_metrics()["num_draft_tokens"] > 0, "nothing drafted: the test is void"
        assert got.token_ids[0] != argmax
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason


@pytest.mark.parametrize("spec", ["ngram", "draft_model"])
@pytest.mark.parametrize("n", [1, 2])
def test_a_request_admitted_into_a_drafting_step_gets_every_logprob(dirs, spec, n):
    """Case 3: one logprob entry per token, on the right token, and the cumulative sum of them, for a
    request (and its forked completion) admitted while another drafts."""
    params = SamplingParams(n=n, temperature=0, max_tokens=8, logprobs=2, ignore_eos=True)
    want = _drive(_llm(dirs), REPEAT, P9, params, 6)
    llm = _llm(dirs, speculative_config=_spec(dirs, spec))
    got = _drive(llm, REPEAT, P9, params, 6)
    assert llm.get_spec_metrics()["num_draft_tokens"] > 0, "nothing drafted: the test is void"
    for g, w in zip(got.outputs, want.outputs, strict=True):
        assert g.token_ids == w.token_ids
        assert len(g.logprobs) == len(g.token_ids)
        for token, entry, expected in zip(g.token_ids, g.logprobs, w.logprobs, strict=True):
            assert entry[token].rank == expected[token].rank
            assert entry[token].logprob == pytest.approx(expected[token].logprob, abs=1e-4)
        assert g.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in
                                                         zip(g.token_ids, g.logprobs, strict=True)))
        assert g.cumulative_logprob == pytest.approx(w.cumulative_logprob, abs=1e-3)


def test_the_default_cpu_budget_holds_max_num_seqs_full_length_requests(dirs):
    """Case 4: with max_num_seqs=1 and no explicit budget, one request that may reach max_model_len is
    served (the null block is paid for apart from the requests' blocks)."""
    llm = _llm(dirs, block_size=16, max_num_seqs=1, max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    rid = llm.engine.add_request(P9, params)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    out = llm.engine.pop_finished(rid).outputs[0]
    assert len(P9) + len(out.token_ids) == 64 and out.finish_reason == "length"
    two = _llm(dirs, block_size=16, max_num_seqs=2, max_model_len=64)
    assert two.engine.num_kv_blocks == 2 * llm.engine.num_kv_blocks


@pytest.mark.parametrize("caching", [False, True])
def test_n_larger_than_max_num_seqs_is_served_in_turns(dirs, caching):
    """Case 5: n=3 completions with two seats: each completion equals the lone request with its seed.
    The third waits with the prompt's last block, which completion 0 fills (and, with prefix caching,
    caches) and lets go of before the third writes it."""
    llm = _llm(dirs, block_size=4, max_num_seqs=2, enable_prefix_caching=caching)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    rid = llm.engine.add_request(P9, params)
    peak = 0
    with deadline(30):
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
            peak = max(peak, len(llm.engine.scheduler.running))
    out = llm.engine.pop_finished(rid)
    llm.engine.kv.check_invariants()
    assert peak <= 2
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for i, c in enumerate(out.outputs):
        lone = SamplingParams(temperature=1.0, seed=child_seed(7, i), max_tokens=12, ignore_eos=True)
        assert llm.generate([P9], lone, use_tqdm=False)[0].outputs[0].token_ids == c.token_ids

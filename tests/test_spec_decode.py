"""Speculative decoding through the engine: lossless greedy output (both proposers, k in {1, 3, 5}, forced
preemption, prefix caching, chunked prefill), stop conditions inside an accepted run, rollback that keeps
rejected tokens out of the prefix cache and the pools consistent, metrics, and the per-batch-size k."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import add_tokenizer, hf_greedy, make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.assets import default_draft_dir, default_model_dir
from minirunner.kv.block_pool import chain_hash

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target, a draft that is a noisy copy of it (partial acceptance), and an exact copy
    (everything accepted: the bonus-token path). Same vocabulary (96)."""
    root = tmp_path_factory.mktemp("spec")
    target_dir, target = make_tiny_model(root, "llama_gqa", seed=1)
    target.save_pretrained(root / "same", safe_serialization=True)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.1)
    target.save_pretrained(root / "noisy", safe_serialization=True)
    return dict(target=str(target_dir), noisy=str(root / "noisy"), same=str(root / "same"))


def _spec(pair, method, k, draft="noisy", **extra):
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                "prompt_lookup_max": 3, **extra}
    return {"method": "draft_model", "model": pair[draft], "num_speculative_tokens": k, **extra}


def _prompts(n=16, vocab=96, seed=0):
    """n prompts sharing a 12-token prefix (prefix-cache hits), some with repeated phrases (n-gram
    hits), lengths 1..19 past the prefix (tripled for every third prompt)."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, vocab, (12,), generator=g).tolist()
    prompts = []
    for i in range(n):
        tail = torch.randint(3, vocab, (int(torch.randint(1, 20, (1,), generator=g)),),
                             generator=g).tolist()
        prompts.append(prefix + (tail * 3 if i % 3 == 0 else tail))
    return prompts


def _run(llm, prompts, params, check=None):
    """Drive the engine step by step, checking both pools' invariants after every step. params: one
    SamplingParams for every prompt, or a list of one per prompt."""
    engine = llm.engine
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    while engine.has_unfinished_requests():
        engine.step()
        engine.kv.check_invariants()
        if check is not None:
            check(engine)
    return [engine.pop_finished(i) for i in ids]


def _cached_hashes_are_verified(engine, outputs):
    """Every block in the prefix cache holds a full block of some request's verified tokens."""
    verified = set()
    bs = engine.config.block_size
    for out in outputs:
        tokens = out.prompt_token_ids + out.outputs[0].token_ids
        parent = None
        for i in range(len(tokens) // bs):
            parent = chain_hash(parent, tuple(tokens[i * bs:(i + 1) * bs]), engine.block_pool.salt)
            verified.add(parent)
    cached = {h for h in engine.block_pool.block_hash if h is not None}
    assert cached <= verified, "a block holding unverified (rejected) tokens entered the prefix cache"


@pytest.fixture(scope="module")
def plain(pair):
    return LLM(pair["target"], device="cpu", attention_backend="torch")


@pytest.fixture(scope="module")
def plain_outputs(plain):
    return [o.outputs[0].token_ids for o in plain.generate(_prompts(), GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("proposer", ["draft_model", "ngram"])
def test_greedy_is_lossless_with_preemption_and_prefix_caching(pair, proposer, k, plain_outputs):
    # 16 requests of up to ~90 tokens in 40 blocks of 4 tokens: the pool runs dry and preempts.
    llm = LLM(pair["target"], device="cpu", attention_backend="torch", block_size=4,
              num_kv_blocks=40, enable_prefix_caching=True, max_num_batched_tokens=64,
              speculative_config=_spec(pair, proposer, k))
    outputs = _run(llm, _prompts(), GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == plain_outputs
    trace = llm.get_step_trace()
    assert sum(t["num_preempted"] for t in trace) > 0, "the tiny KV budget should force preemption"
    assert sum(o.metrics.num_cached_prompt_tokens for o in outputs) > 0, "prefix cache never hit"
    assert sum(t["num_prefill_tokens"] > 0 and t["num_decode_tokens"] > 0 for t in trace) > 0
    m = llm.get_spec_metrics()
    assert m["num_accepted_tokens"] > 0, "nothing was accepted: the test would not exercise runs"
    assert m["num_accepted_tokens"] < m["num_draft_tokens"], "nothing was rejected: no rollback"
    assert max(m["steps_by_k"]) <= k
    _cached_hashes_are_verified(llm.engine, outputs)


@pytest.mark.parametrize("draft", ["same", "noisy"])
def test_stops_inside_an_accepted_run_truncate_it(pair, plain, plain_outputs, draft):
    """Stop ids, EOS and max_tokens land mid-run (k = 5; with the exact-copy draft every run is
    accepted in full): spec output, finish reason and stop reason equal plain decoding's."""
    prompts = _prompts()[:8]
    spec = LLM(pair["target"], device="cpu", attention_backend="torch",
               speculative_config=_spec(pair, "draft_model", 5, draft))
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (1, 2, 3, 7)]
    params += [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                              stop_token_ids=[plain_outputs[i][4 + i]]) for i in (4, 5, 6)]
    params.append(SamplingParams(temperature=0, max_tokens=16, ignore_eos=False))  # EOS id 2
    want = plain.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    for w, g in zip(want, got, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert (g.outputs[0].finish_reason, g.outputs[0].stop_reason) == \
            (w.outputs[0].finish_reason, w.outputs[0].stop_reason)
    assert sum(o.outputs[0].finish_reason == "stop" for o in got) >= 3


def test_stop_string_inside_a_run(pair, plain):
    add_tokenizer(Path(pair["target"]))
    plain_t = LLM(pair["target"], device="cpu", attention_backend="torch")
    spec = LLM(pair["target"], device="cpu", attention_backend="torch",
               speculative_config=_spec(pair, "draft_model", 5, "same"))
    text = plain_t.generate(["the quick brown"], GREEDY, use_tqdm=False)[0].outputs[0].text
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[text[6:9]])
    want = plain_t.generate(["the quick brown"], params, use_tqdm=False)[0].outputs[0]
    got = spec.generate(["the quick brown"], params, use_tqdm=False)[0].outputs[0]
    assert (got.text, got.finish_reason, got.stop_reason) == (want.text, want.finish_reason,
                                                              want.stop_reason)
    assert got.finish_reason == "stop"


def test_max_model_len_inside_a_run(pair):
    prompts = [p[:30] for p in _prompts()[:4]]
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    want = LLM(pair["target"], device="cpu", attention_backend="torch", max_model_len=41).generate(
        prompts, params, use_tqdm=False)
    got = LLM(pair["target"], device="cpu", attention_backend="torch", max_model_len=41,
              speculative_config=_spec(pair, "draft_model", 5, "same")).generate(
        prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert all(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) == 41 for o in got)


def test_tiny_pair_of_other_architectures_matches_transformers(tmp_path):
    """A Llama target with a Qwen3 draft of the same vocabulary: greedy output equals transformers'."""
    target_dir, target = make_tiny_model(tmp_path, "llama_gqa", seed=1)
    draft_dir, _ = make_tiny_model(tmp_path, "qwen3", seed=2)
    llm = LLM(str(target_dir), device="cpu", attention_backend="torch", block_size=8,
              speculative_config={"method": "draft_model", "model": str(draft_dir),
                                  "num_speculative_tokens": 3})
    prompts = [[5, 6, 7, 8, 9], [10, 11] * 6, [40] * 3]
    out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)
    for p, o in zip(prompts, out, strict=True):
        assert o.outputs[0].token_ids == hf_greedy(target, p, 12)
    assert llm.get_spec_metrics()["num_draft_tokens"] > 0


def test_seeded_sampling_with_speculation_is_reproducible_and_follows_the_params(pair):
    llm = LLM(pair["target"], device="cpu", attention_backend="torch",
              speculative_config=_spec(pair, "draft_model", 3))
    prompts = _prompts()[:4]
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=16, seed=7, ignore_eos=True)
    a = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    b = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert a == b
    assert llm.get_spec_metrics()["num_accepted_tokens"] > 0


def test_per_request_and_engine_metrics_agree_with_the_trace(pair):
    llm = LLM(pair["target"], device="cpu", attention_backend="torch",
              speculative_config=_spec(pair, "draft_model", 3))
    outputs = llm.generate(_prompts()[:5], GREEDY, use_tqdm=False)
    engine = llm.get_spec_metrics()
    trace = llm.get_step_trace()
    assert engine["num_draft_tokens"] == sum(t["num_draft_tokens"] for t in trace)
    assert engine["num_accepted_tokens"] == sum(t["num_accepted_tokens"] for t in trace)
    per_request = [o.metrics.spec_decode for o in outputs]
    assert sum(m["num_accepted_tokens"] for m in per_request) == engine["num_accepted_tokens"]
    for o, m in zip(outputs, per_request, strict=True):
        # every output token after the first came from a verify step (ignore_eos, no stop inside),
        # except the last one when a single token was left (k = 0 at max_tokens - 1)
        assert len(o.outputs[0].token_ids) - 2 <= m["num_emitted_tokens"] <= len(o.outputs[0].token_ids) - 1
        assert 0 <= m["acceptance_rate"] <= 1 and len(m["acceptance_by_position"]) == 3
    assert engine["propose_s"] > 0 and engine["verify_s"] > 0
    for t in trace:
        for k, accepted in t["spec_runs"].values():
            assert 0 <= accepted <= k <= 3


def test_preemption_and_finish_free_the_drafts_state_with_the_targets_rows(pair):
    """A pool so small it preempts: the draft model's K/V lives in the target's blocks and its drafts in
    the worker's rows, so a preempted or finished request leaves nothing of the draft behind (no q kept
    without a row, every block back in the one pool), and the greedy tokens are the target's alone."""
    prompts = _prompts(8)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(pair["target"], device="cpu", attention_backend="torch")
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy, use_tqdm=False)]
    llm = LLM(pair["target"], device="cpu", attention_backend="torch", block_size=4, num_kv_blocks=26,
              speculative_config=_spec(pair, "draft_model", 3))
    engine, runner = llm.engine, llm.engine.runner
    ids = [engine.add_request(p, greedy) for p in prompts]
    preempted_seen = 0
    while engine.has_unfinished_requests():
        engine.step()
        engine.kv.check_invariants()
        rows = set(runner.state.row_of)
        assert set(runner.drafter.probs) <= rows, "draft q kept for a request the worker forgot"
        for request in engine.scheduler.waiting:
            if request.num_preemptions:  # preempted this step or before: its rows went with the data
                preempted_seen += 1
                assert request.request_id not in rows and request.request_id not in runner.drafter.probs
    assert preempted_seen, "the tiny pool was meant to preempt"
    assert sum(t.num_preempted for t in engine.trace) > 0
    outputs = [engine.pop_finished(i) for i in ids]
    assert [o.outputs[0].token_ids for o in outputs] == want
    assert engine.block_pool.num_used_blocks == 0  # the draft holds no pool of its own
    assert set(runner.state.row_of) <= set(engine.trace[-1].finished_ids)  # forgotten with the next step
    drafted = {rid for t in engine.trace for rid in t.spec_runs}
    assert drafted == set(ids), "a request never got drafts"


def test_batch_size_table_turns_speculation_off_for_large_batches(pair, plain_outputs):
    llm = LLM(pair["target"], device="cpu", attention_backend="torch", speculative_config=_spec(
        pair, "draft_model", 4,
        num_speculative_tokens_per_batch_size=[[1, 2, 4], [3, 8, 2], [9, 64, 0]]))
    outputs = llm.generate(_prompts(), GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == plain_outputs
    for t in llm.get_step_trace():
        n = len(t["request_ids"])
        ks = [k for k, _ in t["spec_runs"].values()]
        if n >= 9:
            assert not ks
        elif ks:
            assert max(ks) <= (4 if n <= 2 else 2)


def test_acceptance_driven_k_stays_lossless_and_drops_k_when_drafts_fail(pair, tmp_path,
                                                                         plain_outputs):
    llm = LLM(pair["target"], device="cpu", attention_backend="torch", speculative_config=_spec(
        pair, "draft_model", 5, dynamic_k="acceptance", cost_ratio=0.2))
    outputs = llm.generate(_prompts(), GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == plain_outputs
    # a random draft on a random target is almost never accepted: k falls to 0 (with probes)
    target_dir, _ = make_tiny_model(tmp_path, "llama", seed=1)
    draft_dir, _ = make_tiny_model(tmp_path, "qwen2", seed=9)
    bad = LLM(str(target_dir), device="cpu", attention_backend="torch", speculative_config={
        "method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 5,
        "dynamic_k": "acceptance", "cost_ratio": 0.5})
    bad.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
                 use_tqdm=False)
    ks = [max(k for k, _ in t["spec_runs"].values()) if t["spec_runs"] else 0
          for t in bad.get_step_trace()]
    assert ks[1] == 5 and ks[-10:].count(0) >= 8


def test_embedded_target_uses_the_embedded_draft():
    llm = LLM(speculative_config={"method": "draft_model", "num_speculative_tokens": 2},
              device="cpu")
    assert llm.engine.spec.config.model == str(default_draft_dir())
    assert llm.engine.config.model == str(default_model_dir())


@pytest.mark.parametrize("proposer", ["draft_model", "ngram"])
def test_processors_and_logprobs_are_applied_whatever_the_batch_drafts(pair, plain, proposer):
    """The rejection sampler knows temperature / top-k / top-p only: a request with penalties, logit
    bias, pending min_tokens or logprobs must get exactly what plain decoding gives it, and so must the
    greedy requests batched with it."""
    prompts = _prompts(6)
    special = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=1.3),
               SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logit_bias={5: 4.0}),
               SamplingParams(temperature=0, max_tokens=16, min_tokens=12, stop_token_ids=[7, 9]),
               SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)]
    params = special + [GREEDY, GREEDY]
    spec = LLM(pair["target"], device="cpu", attention_backend="torch",
               speculative_config=_spec(pair, proposer, 3))
    want = plain.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert len(got[3].outputs[0].logprobs) == len(got[3].outputs[0].token_ids)
    # alone, the greedy requests still speculate
    spec.generate(prompts[4:], GREEDY, use_tqdm=False)
    assert any(t["num_draft_tokens"] for t in spec.get_step_trace())


@pytest.mark.parametrize("layout", ["contiguous", "contiguous_exact"])
def test_contiguous_layouts_speculate_losslessly(pair, plain_outputs, layout):
    """The pre-paging baseline speculates too (its reservation simply keeps the rejected slots)."""
    llm = LLM(pair["target"], device="cpu", attention_backend="torch", kv_layout=layout,
              speculative_config=_spec(pair, "draft_model", 3))
    outputs = llm.generate(_prompts(), GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == plain_outputs
    assert any(t["num_accepted_tokens"] for t in llm.get_step_trace())

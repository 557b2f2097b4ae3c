"""Oracle tests: minirunner's greedy tokens and logits equal transformers' for every supported family,
under every scheduling path (preemption, chunked prefill, prefix caching, odd block sizes)."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import TINY, hf_greedy, make_tiny_model

from minirunner import LLM, SamplingParams

MAX_NEW = 12
_rng = random.Random(1234)
# Lengths 1..45, none a multiple of 7 (so block size 7 divides none of them).
PROMPT_LENS = [1, 3, 5, 9, 13, 17, 26, 33, 45]
PROMPTS = [[_rng.randrange(3, 96) for _ in range(n)] for n in PROMPT_LENS]
# Prompts sharing a 2-block prefix (block size 16) with different tails, and one exact duplicate.
_PREFIX = [_rng.randrange(3, 96) for _ in range(34)]
SHARED = [_PREFIX + [_rng.randrange(3, 96) for _ in range(k)] for k in (1, 4, 9, 15)] \
    + [_PREFIX[:20], _PREFIX + [5]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    built = {}
    for name in TINY:
        path, model = make_tiny_model(root, name)
        built[name] = (path, model, {})
    return built


def expected(models, name, prompts):
    _, model, cache = models[name]
    out = []
    for p in prompts:
        key = tuple(p)
        if key not in cache:
            cache[key] = hf_greedy(model, p, MAX_NEW)
        out.append(cache[key])
    return out


def run(path, prompts, **kw):
    kw.setdefault("attention_backend", "torch")
    llm = LLM(str(path), dtype="float32", device="cpu", **kw)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    llm.engine.kv.check_invariants()
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("name", sorted(TINY))
def test_greedy_matches_transformers(models, name):
    path = models[name][0]
    _, got = run(path, PROMPTS)
    assert got == expected(models, name, PROMPTS)


@pytest.mark.parametrize("block_size", [1, 16, 7])
def test_block_sizes(models, block_size):
    _, got = run(models["llama_gqa"][0], PROMPTS, block_size=block_size)
    assert got == expected(models, "llama_gqa", PROMPTS)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen3"])
def test_preemption_and_resume(models, name):
    # 8 blocks of 8 tokens: the longest request needs 8 blocks alone, so the batch must preempt.
    llm, got = run(models[name][0], PROMPTS, block_size=8, num_kv_blocks=8, max_model_len=64)
    trace = llm.get_step_trace()
    assert sum(t["num_preempted"] for t in trace) > 0, "the small pool should have forced preemption"
    assert got == expected(models, name, PROMPTS)
    assert llm.engine.block_pool.num_free_blocks == 8


def test_chunked_prefill(models):
    llm, got = run(models["qwen2"][0], PROMPTS, max_num_batched_tokens=10)
    trace = llm.get_step_trace()
    assert max(t["num_tokens"] for t in trace) <= 10
    assert got == expected(models, "qwen2", PROMPTS)


def test_prefix_caching(models):
    path = models["llama"][0]
    llm = LLM(str(path), dtype="float32", device="cpu", attention_backend="torch",
              enable_prefix_caching=True, max_num_seqs=2)
    outs = llm.generate(SHARED, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected(models, "llama", SHARED)
    hits = [o.metrics.num_cached_prompt_tokens for o in outs]
    assert sum(hits) >= 32 * 3, f"shared prefixes should hit the cache, got {hits}"
    llm.engine.kv.check_invariants()
    # A second round reuses blocks that are free but still cached.
    again = llm.generate(SHARED, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == expected(models, "llama", SHARED)
    assert all(o.metrics.num_cached_prompt_tokens > 0 for o in again if len(o.prompt_token_ids) > 16)


def test_prefix_caching_with_chunking_and_preemption(models):
    llm, got = run(models["llama"][0], SHARED + PROMPTS, enable_prefix_caching=True,
                   block_size=4, num_kv_blocks=20, max_model_len=64, max_num_batched_tokens=12)
    assert got == expected(models, "llama", SHARED + PROMPTS)
    assert sum(t["num_preempted"] for t in llm.get_step_trace()) > 0


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "batch-invariant"])
@pytest.mark.parametrize("name", ["llama_gqa", "qwen2", "qwen3", "llama3_rope"])
def test_prefill_and_first_decode_logits(models, name, batch_invariant):
    path, model, _ = models[name]
    llm = LLM(str(path), dtype="float32", device="cpu", attention_backend="torch",
              batch_invariant=batch_invariant)
    engine = llm.engine
    prompts = PROMPTS[2:6]
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    prefill = engine.execute_step().runner_output.first_logits()  # logits of the first generated token
    decode = engine.execute_step().runner_output.first_logits()  # first decode step
    for rid, p in zip(ids, prompts, strict=True):
        first = engine.requests[rid].output_token_ids[0]
        with torch.no_grad():
            ref = model(torch.tensor([p + [first]])).logits[0].float()
        torch.testing.assert_close(prefill[rid], ref[-2], atol=1e-4, rtol=0)
        torch.testing.assert_close(decode[rid], ref[-1], atol=1e-4, rtol=0)

"""Prefix-cache keys are sha256 chains (salted by model and KV dtype), and the cache survives everything
but a failed step: an early-exited stream or an abort leaves full blocks serving the next identical
prompt; a step that raised mid-forward drops only the blocks it registered; num_cached_tokens counts
prompt tokens at first admission only."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.engine.request import Request
from minirunner.engine.scheduler import add_cached_tokens
from minirunner.kv import KVCacheManager
from minirunner.kv.block_pool import BlockPool, chain_hash

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPT = [3, 4, 5, 6] * 9  # 36 tokens: 4 full blocks of 8 and a partial one


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("keys"), "llama")
    return path


def _llm(model_dir, **kw):
    return LLM(str(model_dir), dtype="float32", device="cpu", attention_backend="torch",
               block_size=8, enable_prefix_caching=True, **kw)


def test_digest_is_a_salted_sha256_chain():
    tokens = (7, 8, 9)
    first = chain_hash(None, tokens, b"salt")
    expected = hashlib.sha256(b"salt" + bytes(32) + np.array(tokens, "<i8").tobytes()).digest()
    assert first == expected and len(first) == 32
    assert chain_hash(first, tokens, b"salt") != first, "the parent is part of the key"
    assert chain_hash(None, tokens, b"other model") != first, "the salt is part of the key"
    pool = BlockPool(2, 3, salt=b"salt")
    (a,) = pool.allocate(1)
    assert pool.cache_block(a, None, tokens) == first and isinstance(first, bytes)


def test_engines_salt_by_dtype(model_dir):
    pools = [LLM(str(model_dir), dtype=d, device="cpu", enable_prefix_caching=True).engine.block_pool
             for d in ("float32", "bfloat16")]
    assert pools[0].salt != pools[1].salt


def test_early_exited_stream_leaves_the_prefix_cache_serving(model_dir):
    llm = _llm(model_dir)
    for n, _chunk in enumerate(llm.stream([PROMPT], GREEDY)):
        if n == 2:
            break
    pool = llm.engine.block_pool
    assert pool.num_free_blocks == pool.num_blocks and pool.num_cached_free_blocks >= 4
    out = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 32 == out.metrics.num_cached_prompt_tokens
    fresh = LLM(str(model_dir), dtype="float32", device="cpu", attention_backend="torch",
                block_size=8).generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == fresh.outputs[0].token_ids


def test_abort_keeps_other_requests_cached_blocks(model_dir):
    llm = _llm(model_dir)
    engine = llm.engine
    llm.generate([PROMPT], GREEDY, use_tqdm=False)
    rid = engine.add_request([9, 10, 11] * 6, GREEDY)
    engine.step()
    engine.abort_request(rid)
    llm.engine.abort_all([rid])
    out = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 32


class _Boom(Exception):
    pass


def test_failed_step_drops_only_what_it_registered(model_dir):
    llm = _llm(model_dir)
    engine = llm.engine
    llm.generate([PROMPT], GREEDY, use_tqdm=False)  # 4 cached blocks, K/V written
    other = [20, 21, 22, 23] * 5  # 2 full blocks, registered when its step is scheduled

    def fail(*_):
        raise _Boom("the forward failed half-way")

    handle = engine.model.model.layers[1].register_forward_hook(fail)
    try:
        with pytest.raises(_Boom):
            llm.generate([other], GREEDY, use_tqdm=False)
    finally:
        handle.remove()
    assert not engine.requests and not engine.has_unfinished_requests()
    engine.kv.check_invariants()
    again = llm.generate([PROMPT, other], GREEDY, use_tqdm=False)
    assert again[0].num_cached_tokens == 32, "blocks written by earlier steps stay cached"
    assert again[1].num_cached_tokens == 0, "blocks the failed step registered were dropped"
    ref = LLM(str(model_dir), dtype="float32", device="cpu", attention_backend="torch",
              block_size=8).generate([other], GREEDY, use_tqdm=False)[0]
    assert again[1].outputs[0].token_ids == ref.outputs[0].token_ids


def test_num_cached_tokens_is_prompt_tokens_at_first_admission():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    donor = Request("donor", [1, 2, 3, 4, 5], SamplingParams(), seed=0, max_len=100)
    kv.allocate(donor, 5)
    donor.num_computed_tokens = 5
    kv.cache_full_blocks(donor)
    request = Request("r", [1, 2, 3, 4, 9, 9], SamplingParams(), seed=0, max_len=100)
    cached = kv.find_cached_prefix(request)
    assert kv.allocate(request, 2, cached)
    add_cached_tokens(request, len(cached) * 4)  # what the scheduler does on admission
    assert request.num_cached_tokens == 4
    request.num_computed_tokens = 6
    for token in [7, 7, 7, 7, 7, 7]:  # decode to 12 tokens: 3 full blocks cached
        request.append_token(token)
    kv.allocate(request, 6)
    request.num_computed_tokens = 12
    kv.cache_full_blocks(request)
    kv.free(request)  # preempted (recompute): re-admitted with 2 more full blocks cached
    request.num_computed_tokens, request.num_preemptions = 0, 1
    cached = kv.find_cached_prefix(request)
    assert len(cached) == 2  # (12 - 1) // 4 full blocks, prompt and output tokens
    assert kv.allocate(request, request.num_tokens - 8, cached)
    add_cached_tokens(request, len(cached) * 4)
    assert request.num_computed_tokens == 8
    assert request.num_cached_tokens == 4, "the first admission's prompt hit, not the recompute's"
    kv.free(request)
    kv.free(donor)
    kv.check_invariants()

"""BlockPool and KV manager: a hypothesis state machine drives allocate / append / share-prefix / fork
(copy-on-write) / free / preempt and checks the pool's invariant after every operation; every block is free
at the end."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minirunner.engine.request import Request
from minirunner.kv import BlockPool, KVCacheManager
from minirunner.kv.block_pool import chain_hash
from minirunner.sampling_params import SamplingParams

BLOCK = 4


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(num_blocks=12, block_size=BLOCK, enable_prefix_caching=True)
        self.live: dict[str, Request] = {}
        self.n = 0

    def _new(self, tokens):
        self.n += 1
        return Request(str(self.n), list(tokens), SamplingParams(), seed=0, max_len=10_000)

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=20))
    def allocate(self, tokens):
        """Admit a request: reuse its cached prefix, then allocate for the rest (or fail cleanly)."""
        request = self._new(tokens)
        cached = self.kv.find_cached_prefix(request)
        free_before = self.kv.pool.num_free_blocks
        remaining = len(tokens) - len(cached) * BLOCK
        if self.kv.allocate(request, remaining, cached):
            request.num_computed_tokens = len(tokens)
            self.kv.cache_full_blocks(request)
            self.live[request.request_id] = request
        else:
            assert self.kv.pool.num_free_blocks == free_before, "a failed allocation changed the pool"

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=st.integers(1, 6))
    def append(self, data, extra):
        """Decode: a live request grows by a few tokens (needs new blocks at block boundaries)."""
        request = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda r: r.request_id)))
        new = [data.draw(st.integers(0, 3)) for _ in range(extra)]
        for token in new:
            request.append_token(token)
        if self.kv.allocate(request, extra):
            # What the runner does before the step: copy each shared block the request writes into
            # from a block still held to one only this request holds.
            table = self.kv.table(request.request_id).blocks
            for src, dst in self.kv.take_copies():
                assert src != dst and self.kv.pool.ref_counts[src] >= 1
                assert dst in table and self.kv.pool.ref_counts[dst] == 1
            request.num_computed_tokens += extra
            self.kv.cache_full_blocks(request)
        else:
            del request.output_token_ids[-extra:]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def share_prefix(self, data):
        """A new request copies a live request's tokens, so its full blocks come from the cache."""
        source = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda r: r.request_id)))
        request = self._new(source.all_token_ids[:source.num_computed_tokens] + [1])
        cached = self.kv.find_cached_prefix(request)
        assert len(cached) == source.num_computed_tokens // BLOCK
        if self.kv.allocate(request, request.num_tokens - len(cached) * BLOCK, cached):
            request.num_computed_tokens = request.num_tokens
            self.kv.cache_full_blocks(request)
            self.live[request.request_id] = request
            for b in cached:
                assert self.kv.pool.ref_counts[b] >= 2

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        """n > 1: a live request has computed its prompt; a child takes references to the prompt's blocks
        (only those: the parent's output is its own) and recomputes the last prompt token, as
        parallel_sampling does; its first write into a shared block copies it (copy-on-write)."""
        source = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda r: r.request_id)))
        child = self._new(source.prompt_token_ids)
        self.kv.fork(source, child)
        child.num_computed_tokens = len(child.prompt_token_ids) - 1
        self.live[child.request_id] = child
        blocks = self.kv.table(child.request_id).blocks
        assert len(blocks) == -(-len(source.prompt_token_ids) // BLOCK)
        assert blocks == self.kv.table(source.request_id).blocks[:len(blocks)]
        for block in blocks:
            assert self.kv.pool.ref_counts[block] >= 2

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.kv.free(self.live.pop(rid))

    @precondition(lambda self: self.live)
    @rule()
    def preempt_newest(self):
        """Recompute preemption: the newest request loses its blocks and its computed tokens."""
        rid = max(self.live, key=int)
        request = self.live.pop(rid)
        self.kv.free(request)
        request.num_computed_tokens = 0

    @invariant()
    def consistent(self):
        self.kv.check_invariants()

    def teardown(self):
        for request in list(self.live.values()):
            self.kv.free(request)
        self.kv.check_invariants()
        pool = self.kv.pool
        assert pool.num_free_blocks == pool.num_blocks
        assert all(rc == 0 for rc in pool.ref_counts)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40)


def test_cached_free_blocks_are_evicted_lru():
    pool = BlockPool(num_blocks=3, block_size=2)
    a, b, c = pool.allocate(3)
    ha = pool.cache_block(a, None, (1, 2))
    pool.cache_block(b, ha, (3, 4))
    pool.free([a])
    pool.free([b])
    pool.free([c])
    assert pool.num_free_blocks == 3 and pool.num_cached_free_blocks == 2
    # The least recently freed cached block (a) is handed out first and loses its hash.
    assert pool.allocate(1) == [a]
    assert pool.lookup(None, (1, 2)) is None
    assert pool.lookup(ha, (3, 4)) == b
    pool.check_invariants([[a]])


def test_a_forced_digest_collision_shares_nothing():
    pool = BlockPool(num_blocks=2, block_size=2)
    (a,) = pool.allocate(1)
    h = pool.cache_block(a, None, (1, 2))
    # Force a collision: block a listed under the digest of other tokens (as if sha256 collided)
    # must not be returned for them, since the stored (parent, tokens) key is compared too.
    forged = chain_hash(None, (2, 1), pool.salt)
    pool.cached[forged] = {a: None}
    assert pool.lookup(None, (1, 2)) == a
    assert pool.lookup(None, (2, 1)) is None
    del pool.cached[forged]
    assert h in pool.cached


def test_invariant_check_catches_a_corrupted_pool():
    pool = BlockPool(num_blocks=4, block_size=2)
    blocks = pool.allocate(2)
    pool.check_invariants([blocks])
    with pytest.raises(AssertionError):
        pool.check_invariants([blocks[:1]])  # ref count 1 but no table holds the block
    pool.ref_counts[blocks[0]] = 0  # referenced-count lost while not on the free list
    with pytest.raises(AssertionError):
        pool.check_invariants()

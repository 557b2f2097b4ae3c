"""A hypothesis state machine over the scheduler and a tiny KV pool, with no model: requests (n > 1
among them) are added, stepped (with speculative drafts, partly rejected), aborted and forked the way
the engine does it. After every rule the pool is consistent, and liveness holds: every step with work
schedules tokens or preempts, and draining the queue always ends within a bound."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minirunner.engine.parallel_sampling import child_id, fork_children
from minirunner.engine.request import Request
from minirunner.engine.scheduler import Scheduler
from minirunner.kv.manager import KVCacheManager
from minirunner.sampling_params import SamplingParams


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 1 << 32))
    def setup(self, seed):
        # The pool's shape comes from the seed, not from hypothesis' integers (which favour the
        # smallest values: a 3-token pool where nothing interesting can happen).
        self.rng = random.Random(seed)
        r = self.rng
        self.kv = KVCacheManager(r.randint(3, 12), r.choice([1, 2, 4]), r.random() < 0.5)
        self.scheduler = Scheduler(self.kv, r.randint(1, 4), r.randint(1, 16))
        self.live: list[Request] = []
        self.ids = 0

    @rule(prompt_len=st.integers(1, 16), max_tokens=st.integers(1, 32), n=st.integers(1, 3),
          alphabet=st.integers(2, 6), whole_pool=st.booleans())
    def add(self, prompt_len, max_tokens, n, alphabet, whole_pool):
        prompt = [self.rng.randrange(alphabet) for _ in range(prompt_len)]
        if whole_pool:  # a request that may need every block of the pool (the hardest to admit)
            max_tokens = max(1, self.kv.pool.num_blocks * self.kv.block_size + 1 - prompt_len)
        max_len = prompt_len + max_tokens
        if self.kv.reservation_blocks(max_len) > self.kv.pool.num_blocks:
            return  # the engine refuses it at admission
        rid, self.ids = str(self.ids), self.ids + 1
        params = SamplingParams(n=n, max_tokens=max_tokens)
        group = [Request(child_id(rid, i), prompt, params, i, max_len, group_id=rid, index=i)
                 for i in range(n)]
        group[0].fork_children = group[1:]
        self.live += group
        self.scheduler.add(group[0])

    @rule()
    def add_from_seed(self):
        """A request shaped by the machine's seeded generator: hypothesis favours small sizes, and the
        hard cases (a large request ahead of n > 1 completions in a small pool) need large ones."""
        r = self.rng
        self.add(r.randint(1, 16), r.randint(1, 32), r.randint(1, 3), 4, r.random() < 0.5)

    @precondition(lambda self: self.scheduler.has_unfinished())
    @rule(draft=st.booleans())
    def step(self, draft):
        self._step(draft)

    @precondition(lambda self: any(not r.is_finished for r in self.live))
    @rule(data=st.data())
    def abort(self, data):
        request = data.draw(st.sampled_from([r for r in self.live if not r.is_finished]))
        # as the engine: completion 0 carries the group's id, so aborting it aborts every completion
        group = [r for r in self.live if r.group_id == request.group_id] if request.index == 0 \
            else [request]
        for r in group:
            if not r.is_finished:
                self.scheduler.finish(r)
                r.finish("abort")

    @rule()
    def drain(self):
        """Liveness over many steps: the queue empties (a request preempted and recomputed forever, or
        waiting for blocks nobody frees, would not)."""
        bound = 50 + 40 * sum(1 for r in self.live if not r.is_finished)
        for _ in range(bound):
            if not self.scheduler.has_unfinished():
                break
            self._step(draft=self.rng.random() < 0.5)
        assert not self.scheduler.has_unfinished(), (
            f"not drained in {bound} steps: {len(self.scheduler.running)} running, "
            f"{len(self.scheduler.waiting)} waiting, {self.kv.pool.num_free_blocks} blocks free")
        assert self.kv.pool.num_free_blocks == self.kv.pool.num_blocks

    def _step(self, draft: bool) -> None:
        """One engine step: drafts for decode-ready running requests, schedule, run (tokens drawn
        at random, drafts partly accepted), append with the length stop and fork n > 1."""
        for r in self.scheduler.running:
            ready = r.num_computed_tokens == r.num_tokens - 1
            k = min(self.rng.randint(0, 3), r.max_len - r.num_tokens - 1) if draft and ready else 0
            r.spec_token_ids = [self.rng.randrange(4) for _ in range(max(0, k))]
        self.kv.begin_step()
        out = self.scheduler.schedule()
        # Liveness, step by step: work left means tokens scheduled or blocks freed by preemption.
        assert out.scheduled or out.preempted
        assert len(self.scheduler.running) <= self.scheduler.max_num_seqs
        self.kv.take_copies()
        for s in out.scheduled:
            request, samples = s.request, s.is_sampling
            request.num_computed_tokens += s.num_new_tokens
            if not samples:
                continue
            accepted = self.rng.randint(0, len(s.draft_token_ids))
            request.num_computed_tokens -= len(s.draft_token_ids) - accepted
            self.kv.trim(request)
            run = s.draft_token_ids[:accepted] + [self.rng.randrange(4)]
            for token in run:
                request.append_token(token)
                if request.fork_children:
                    self.scheduler.add_forked(fork_children(request, self.kv))
                if request.num_tokens >= request.max_len:
                    request.finish("length")
                    self.scheduler.finish(request)
                    break

    @invariant()
    def pool_is_consistent(self):
        if not hasattr(self, "kv"):
            return
        self.kv.check_invariants()
        for r in self.scheduler.waiting:
            # the only waiting requests holding blocks are forked completions that have not run yet
            if r.request_id in self.kv.tables:
                assert r.index > 0 and not r.output_token_ids
                assert r.num_computed_tokens == len(r.prompt_token_ids) - 1
        held = set(self.kv.tables)
        assert all(r.request_id in held for r in self.scheduler.running)
        assert not any(r.request_id in held for r in self.live if r.is_finished)


SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_scheduler_machine = SchedulerMachine.TestCase

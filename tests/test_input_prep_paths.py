"""The two input paths fill identical buffers: the host path (numpy) and the GPU-native path (the state
rows' device mirrors, kept up to date by staged writes, read by
minirunner/kernels/input_prep.py: its Triton kernel
under TRITON_INTERPRET=1, and its torch twin), over random scheduler outputs driven through real
Requests, ScheduledRequests and a KVCacheManager: new requests, chunked prefills, decodes, speculative
drafts with rollback, graph buckets with padding rows, preempted-and-readmitted requests (tables
replaced), copy-on-write edits of forked tables, a prefix cache, and state rows that outgrow their table.
Then an engine run: the same greedy tokens with the device path forced on a CPU as with the host path.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from test_spec_decode import _prompts, _run, _spec, pair  # noqa: F401

from minirunner import LLM, SamplingParams
from minirunner.engine.request import Request
from minirunner.engine.scheduler import ScheduledRequest
from minirunner.engine.step_data import WorkerRowsSent
from minirunner.kv.block_table import cdiv
from minirunner.kv.manager import KVCacheManager
from minirunner.worker.buffers import StepBuffers
from minirunner.worker.input_batch import prepare_input_batch
from minirunner.worker.state_mirror import StateMirror
from minirunner.worker.states import RequestStateRows

BLOCK, MAX_SEQS, MAX_TOKENS, MAX_LEN = 4, 6, 48, 64
CPU = torch.device("cpu")
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1")


class Path:
    """One way of preparing inputs: its own state rows, buffers and (device path: ``kernel`` "twin",
    "triton" or "default") mirror; ``kernel`` None: the host path."""

    def __init__(self, kernel: str | None, device: torch.device = CPU):
        # 2 rows only: the state rows must grow (and the mirror with them) as requests pile up
        self.state = RequestStateRows(2, cdiv(MAX_LEN, BLOCK))
        self.buffers = StepBuffers(device, MAX_TOKENS, MAX_SEQS, cdiv(MAX_LEN, BLOCK), BLOCK)
        use_triton = {"twin": False, "triton": True, "default": None}
        self.mirror = None if kernel is None else StateMirror(self.state, device, use_triton[kernel])

    def prepare(self, sched, bucket, query_len, sync_check: bool = False) -> dict:
        """``sched``: the step's SchedulerOutput (data), as the worker receives it."""
        if sync_check:  # CUDA: the whole preparation launches work without waiting for the device once
            torch.cuda.set_sync_debug_mode("error")
        try:
            self.state.update(sched)
            inputs = prepare_input_batch(self.state, self.buffers, sched, bucket, query_len, self.mirror)
        finally:
            if sync_check:
                torch.cuda.set_sync_debug_mode("default")
        if self.mirror is not None:  # the staged writes leave the device rows equal to the host rows
            assert np.array_equal(self.mirror.block_tables.cpu().numpy(), self.state.block_tables)
        return snapshot(inputs, self.buffers, bucket, query_len)


def snapshot(inputs, buffers: StepBuffers, bucket, query_len) -> dict:
    """Every buffer row the step reads, and the host metadata its attention plan reads."""
    m = inputs.meta
    n = m.num_seqs
    cols = buffers.max_blocks_per_seq if bucket is not None else cdiv(m.max_seq_len, BLOCK)
    snap = dict(ids=inputs.input_ids, positions=m.positions, slots=m.slot_mapping, qsl=m.query_start_loc,
                seq_lens=m.seq_lens, tables=m.block_tables[:n, :cols], logits_rows=inputs.logits_indices,
                sample_positions=inputs.sample_positions, qsl_cpu=m.query_start_loc_cpu,
                seq_lens_cpu=m.seq_lens_cpu, rows=inputs.sample_rows, drafts=inputs.draft_token_ids,
                num_drafts=inputs.num_drafts, max_lens=np.array([m.max_query_len, m.max_seq_len]))
    if m.block_tables_cpu is not None:
        snap["tables_cpu"] = m.block_tables_cpu
    if bucket is not None:  # what the graph step reads: static views and their host copies
        static = buffers.static_meta(bucket, query_len)
        snap.update(static_qsl_cpu=static.query_start_loc_cpu, static_seq_lens_cpu=static.seq_lens_cpu,
                    static_tables_cpu=static.block_tables_cpu,
                    static_ids=buffers.input_ids[:bucket * query_len],
                    static_slots=static.slot_mapping, static_positions=static.positions,
                    sampling=torch.stack([t.double() for t in buffers.sampling_params(bucket)]))
    return {k: np.array(v.cpu().numpy() if isinstance(v, torch.Tensor) else v, copy=True)
            for k, v in snap.items()}


class World:
    """Requests living through a KV pool small enough to preempt, stepped by random schedules."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.kv = KVCacheManager(40, BLOCK, enable_prefix_caching=True)
        self.sent = WorkerRowsSent()  # what the paths' state rows hold (the scheduler's record)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.next_id = 0
        self.base = [self.rng.randrange(3, 90) for _ in range(12)]  # a shared prefix

    def new_request(self) -> Request:
        prompt = self.base[:self.rng.choice([0, 5, 8, 12])] + \
            [self.rng.randrange(3, 90) for _ in range(self.rng.randint(1, 14))]
        temp = self.rng.choice([0.0, 0.7])
        params = SamplingParams(temperature=temp, top_k=self.rng.choice([-1, 5]), max_tokens=MAX_LEN)
        self.next_id += 1
        return Request(f"r{self.next_id}", prompt, params, seed=self.rng.randrange(1 << 40), max_len=MAX_LEN)

    def schedule(self, paths) -> tuple[list[ScheduledRequest], int | None, int]:
        """A random step: maybe a uniform (graph) step of decodes with k drafts each, else a mix of
        chunked prefills, decodes and drafts, admitting waiting requests (prefix cache first)."""
        rng, kv = self.rng, self.kv
        while len(self.waiting) < 3:
            self.waiting.append(self.new_request())
        decoding = [r for r in self.running if r.num_computed_tokens == r.num_tokens - 1]
        if decoding and rng.random() < 0.4:  # a uniform step, padded to a bucket
            k = rng.choice([0, 0, 1, 3])
            batch = rng.sample(decoding, rng.randint(1, len(decoding)))
            scheduled = self._allocate([(r, k) for r in batch], paths)
            if scheduled and len({len(s.draft_token_ids) for s in scheduled}) == 1:
                bucket = rng.randint(len(scheduled), MAX_TOKENS // (k + 1) if k else MAX_SEQS)
                return scheduled, min(bucket, MAX_SEQS), k + 1
            return scheduled, None, 1
        plan, budget = [], MAX_TOKENS
        for r in rng.sample(self.running, len(self.running)):
            plan.append((r, rng.choice([0, 0, 2]) if r in decoding else None))
        while self.waiting and len(plan) < MAX_SEQS and rng.random() < 0.7:
            r = self.waiting.pop(0)
            cached = kv.find_cached_prefix(r)
            if not kv.allocate(r, 1, cached):
                self.waiting.insert(0, r)
                break
            r.num_computed_tokens += len(cached) * BLOCK  # the scheduler's write on admission
            self.running.append(r)
            plan.append((r, None))
        plan = plan[:MAX_SEQS]
        scheduled = []
        for s in self._allocate(plan, paths):
            if budget >= s.num_new_tokens:
                scheduled.append(s)
                budget -= s.num_new_tokens
        return scheduled, None, 1

    def _allocate(self, plan, paths) -> list[ScheduledRequest]:
        """(request, k drafts or None for a prefill chunk) -> ScheduledRequests with their blocks;
        preempts the last running request when the pool runs dry."""
        out = []
        for r, k in plan:
            if r not in self.running:
                continue
            if k is None:
                n = self.rng.randint(1, r.num_tokens - r.num_computed_tokens)
                drafts = []
            else:
                k = min(k, r.max_len - r.num_tokens - 2)
                drafts, n = [self.rng.randrange(3, 90) for _ in range(k)], k + 1
            while not self.kv.allocate(r, n):
                self.preempt(self.running[-1], paths)
                if r not in self.running:
                    break
            else:
                out.append(ScheduledRequest(r, n, drafts))
        return [s for s in out if s.request in self.running]

    def preempt(self, r: Request, paths) -> None:
        self.kv.free(r)
        self.sent.forget(r.request_id)
        for p in paths:
            p.state.release(r.request_id)
        self.running.remove(r)
        r.num_computed_tokens, r.num_preemptions = 0, r.num_preemptions + 1
        self.waiting.insert(0, r)

    def finish_step(self, scheduled, paths) -> None:
        """What the engine does after the step: advance, accept some drafts, roll back the rest, cache
        full blocks, fork a child sharing the prompt (copy-on-write later), finish long requests."""
        rng, kv = self.rng, self.kv
        for s in scheduled:
            r = s.request
            if not s.is_sampling:
                r.num_computed_tokens += s.num_new_tokens
                continue
            accepted = rng.randint(0, len(s.draft_token_ids))
            for t in s.draft_token_ids[:accepted] + [rng.randrange(3, 90)]:
                r.append_token(t)
            r.num_computed_tokens = r.num_tokens - 1
            kv.trim(r)
            kv.cache_full_blocks(r)
            if len(r.output_token_ids) == 1 and rng.random() < 0.3 and len(self.running) < MAX_SEQS:
                child = Request(r.request_id + "c", r.prompt_token_ids, r.params, seed=1, max_len=MAX_LEN)
                kv.fork(r, child)
                child.append_token(rng.randrange(3, 90))
                child.num_computed_tokens = len(child.prompt_token_ids)
                self.running.append(child)
            if r.num_tokens >= r.max_len - 6:
                kv.free(r)
                self.sent.forget(r.request_id)
                for p in paths:
                    p.state.release(r.request_id)
                self.running.remove(r)
        kv.take_copies()
        kv.check_invariants()


def compare_paths(seed: int, host: Path, device: Path, sync_check: bool = False) -> None:
    """60 random steps through both paths, every step's buffers and host metadata compared."""
    world, paths = World(seed), (host, device)
    seen = dict(graph=0, drafts=0, chunks=0, preempted=0, edited=0)
    for _ in range(60):
        scheduled, bucket, query_len = world.schedule(paths)
        if not scheduled:
            world.finish_step([], paths)
            continue
        sched = world.sent.build(scheduled, world.kv.table)
        want = host.prepare(sched, bucket, query_len)
        got = device.prepare(sched, bucket, query_len, sync_check)
        assert want.keys() == got.keys()
        for key in want:
            assert np.array_equal(want[key], got[key]), key
        seen["graph"] += bucket is not None and bucket > len(scheduled)
        seen["drafts"] += any(s.draft_token_ids for s in scheduled)
        seen["chunks"] += any(not s.is_sampling for s in scheduled)
        seen["preempted"] += any(s.request.num_preemptions for s in scheduled)
        seen["edited"] += any(t.version for t in world.kv.tables.values())
        world.finish_step(scheduled, paths)
    assert all(seen.values()), seen  # every kind of step was exercised
    assert len(host.state.requests) > 2  # the state rows grew, and the mirror with them


@pytest.mark.parametrize("kernel", ["twin", pytest.param("triton", marks=needs_interpreter)])
@pytest.mark.parametrize("seed", range(4))
def test_device_path_fills_the_buffers_of_the_host_path(kernel, seed):
    compare_paths(seed, Path(None), Path(kernel))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("seed", range(2))
def test_cuda_device_path_fills_the_buffers_of_the_host_path_without_a_sync(seed):
    """On CUDA: the compiled Triton kernel over pinned staged writes, no host sync while preparing."""
    cuda = torch.device("cuda")
    device = Path("default", cuda)
    assert device.mirror.kernel.__name__ == "prepare_inputs"  # the CUDA default: the Triton kernel
    compare_paths(seed, Path(None, cuda), device, sync_check=True)


GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
TIGHT = dict(device="cpu", attention_backend="torch", block_size=4, num_kv_blocks=26, max_num_seqs=2,
             max_num_batched_tokens=16, enable_prefix_caching=True)


@pytest.mark.parametrize("graph_mode, proposer",
                         [("none", "none"), ("none", "ngram"), ("none", "draft_model"), ("compile", "ngram")])
def test_engine_tokens_equal_on_both_paths(pair, graph_mode, proposer):  # noqa: F811
    """Chunked prefill, prefix caching, preemption (and drafts, n-gram or from a draft model whose runner
    takes the same path; graph steps padded to a bucket): the same greedy tokens."""
    tokens = {}
    graphs = dict(cudagraph_capture_sizes=[2]) if graph_mode == "compile" else {}
    for prep in ("host", "device"):
        llm = LLM(pair["target"], speculative_config=None if proposer == "none" else _spec(pair, proposer, 2),
                  graph_mode=graph_mode, **graphs, **TIGHT)
        runner = llm.llm_engine.runner  # a draft model reads the target's inputs: one input path
        runner.set_input_prep(prep)
        assert runner.input_prep == prep
        outputs = _run(llm, _prompts(6), GREEDY)
        tokens[prep] = [o.outputs[0].token_ids for o in outputs]
        trace = llm.get_step_trace()
        assert sum(t["num_preempted"] for t in trace) > 0, "the tiny pool was meant to preempt"
        if graph_mode == "compile":  # buckets replayed, a padding row among them
            assert any(t["graph"] == "compile" and t["num_padded_rows"] for t in trace)
            assert any(t["graph"] == "compile" and t["num_draft_tokens"] for t in trace)
    assert tokens["device"] == tokens["host"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_default_is_the_device_path_and_equals_the_host_path(pair):  # noqa: F811
    """On CUDA the runner prepares inputs on the device by default (the Triton kernel), with the same
    greedy tokens as the host path, eager and under CUDA graphs."""
    for graph_mode in ("none", "cuda"):
        tokens = {}
        for prep in ("default", "host"):
            llm = LLM(pair["target"], **{**TIGHT, "device": "cuda", "attention_backend": "triton"},
                      graph_mode=graph_mode, dtype="float32")
            runner = llm.llm_engine.runner
            if prep == "default":
                assert runner.input_prep == "device"
                assert runner.state_mirror.kernel.__name__ == "prepare_inputs"
            else:
                runner.set_input_prep("host")
            tokens[prep] = [o.outputs[0].token_ids for o in _run(llm, _prompts(6), GREEDY)]
        assert tokens["default"] == tokens["host"]

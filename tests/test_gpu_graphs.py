"""CUDA-graph decode on a GPU: greedy tokens of graph_mode="cuda" equal eager ones on the torch, triton and
(when installed) flashinfer backends for batches on and between rungs, and a replay never syncs with the
host; the speculative verify step captured as a bucket gives plain greedy output, and so do speculative
steps scheduled ahead (async_scheduling), whose launches never sync with the host, as plain decode steps
launched ahead do not; eager sampled, mixed prefill + decode and eager speculative steps never wait for
the device inside ``execute`` (every host-to-device copy staged). Skipped without CUDA.
Written with the CPU tests' shapes; not yet run on a GPU.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.core.sync_check import sync_check
from minirunner.worker.cudagraph import GraphKey, GraphKind

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
LADDER = [1, 2, 4, 8, 16]
BACKENDS = ["torch", "triton", pytest.param("flashinfer", marks=pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is None, reason="flashinfer-python is not installed"))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("gpu_graphs"), "llama_gqa", dtype=torch.bfloat16)
    return str(path)


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 96, (9,), generator=g).tolist()
    return [shared + torch.randint(3, 96, (int(k),), generator=g).tolist()
            for k in torch.randint(1, 30, (n,), generator=g)]


def _llm(model_dir, backend, graph_mode):
    return LLM(model_dir, dtype="bfloat16", device="cuda", attention_backend=backend, block_size=16,
               num_kv_blocks=48, enable_prefix_caching=True, max_num_seqs=16,
               cudagraph_capture_sizes=LADDER, graph_mode=graph_mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_greedy_equals_eager(model_dir, backend):
    eager, graphs = _llm(model_dir, backend, "none"), _llm(model_dir, backend, "cuda")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for n in (1, 3, 8, 13):
        prompts = _prompts(n, seed=n)
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
        graphs.clear_step_trace()
        got = [o.outputs[0].token_ids for o in graphs.generate(prompts, params, use_tqdm=False)]
        assert got == want, f"{backend}, batch {n}"
        assert any(t["graph"] == "cuda" for t in graphs.get_step_trace())


@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_does_not_sync_with_the_host(model_dir, backend):
    llm = _llm(model_dir, backend, "cuda")
    engine, runner = llm.engine, llm.engine.runner
    params = SamplingParams(temperature=0.7, top_k=10, seed=1, max_tokens=8, ignore_eos=True)
    for p in _prompts(3, seed=4):
        engine.add_request(p, params)
    engine.step()  # prefills (eager)
    engine.step()  # a graph step: the FILTER sampler of bucket 4, captured at start-up
    assert engine.trace[-1].graph == "cuda"
    _replay_without_host_sync(runner.graphs.cuda_graph(GraphKey(4, GraphKind.FILTER)))


def _replay_without_host_sync(graph) -> None:
    """Replay a captured step with CUDA's sync debug mode set to raise on any host synchronisation."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


VERIFY_BACKENDS = ["torch", "triton"]  # flashinfer: verify steps stay eager (no capturable plan)


@pytest.mark.parametrize("backend", VERIFY_BACKENDS)
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_captured_verify_step_equals_eager_and_does_not_sync(model_dir, backend, method):
    """Speculative decoding with graph_mode="cuda": the uniform verify step (k + 1 queries per request,
    rejection sampler inside) replays a captured bucket, greedy output equals plain eager greedy, and
    the replay itself never syncs with the host."""
    spec = {"method": method, "num_speculative_tokens": 2}
    if method == "draft_model":
        spec["model"] = model_dir  # the target as its own draft: every draft accepted (bonus path)
    plain = _llm(model_dir, backend, "none")
    graphs = LLM(model_dir, dtype="bfloat16", device="cuda", attention_backend=backend, block_size=16,
                 num_kv_blocks=96, max_num_seqs=4, cudagraph_capture_sizes=[1, 2, 4],
                 graph_mode="cuda", speculative_config=spec)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [p * 3 for p in _prompts(3, seed=7)]  # repeated phrases: n-gram drafts
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    graphs.clear_step_trace()
    assert [o.outputs[0].token_ids for o in graphs.generate(prompts, params, use_tqdm=False)] == want
    replays = [t for t in graphs.get_step_trace() if t["graph"] == "cuda" and t["num_draft_tokens"]]
    assert replays, "no verify step replayed a captured bucket"
    key = next(k for k in graphs.engine.runner.graphs.keys() if k.query_len > 1)
    _replay_without_host_sync(graphs.engine.runner.graphs.cuda_graph(key))


@pytest.mark.parametrize("backend", VERIFY_BACKENDS[:1])  # one backend: the GPU run's time budget
def test_options_of_one_request_cost_its_row_only(model_dir, backend):
    """Sampling after the replay (issue 53): in a captured batch where one request asks for logprobs and
    another has a frequency penalty, verify steps still replay (those two verified with k = 0 in the
    same step, padded inside their rows), the others still carry n-gram drafts, and every output
    equals plain eager decoding."""
    plain = _llm(model_dir, backend, "none")
    graphs = LLM(model_dir, dtype="bfloat16", device="cuda", attention_backend=backend, block_size=16,
                 num_kv_blocks=96, max_num_seqs=4, cudagraph_capture_sizes=[1, 2, 4], graph_mode="cuda",
                 speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    base = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    params = [SamplingParams(**base), SamplingParams(**base, logprobs=3),
              SamplingParams(**base, frequency_penalty=0.5), SamplingParams(**base)]
    prompts = [p * 3 for p in _prompts(4, seed=13)]  # repeated phrases: n-gram drafts
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    graphs.clear_step_trace()
    got = graphs.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == want
    assert len(got[1].outputs[0].logprobs) == len(want[1])
    special = {got[1].request_id, got[2].request_id}
    replays = [t for t in graphs.get_step_trace() if t["graph"] == "cuda" and t["num_draft_tokens"]]
    assert replays and any(special <= set(t["request_ids"]) for t in replays)
    assert not any(special & set(t["spec_runs"]) for t in replays)


@pytest.mark.parametrize("backend", VERIFY_BACKENDS)
def test_async_speculation_is_lossless_and_never_waits_for_the_device(model_dir, tmp_path, backend):
    """async_scheduling=True under graph_mode="cuda": greedy output equals plain eager greedy with a
    draft that is often rejected (another random model of the same vocabulary), steps run scheduled
    ahead, and once every bucket is captured, preparing and launching a step ahead (the acceptance
    update on the device, the draft's passes, the verify inputs and replay) never syncs with the host."""
    draft, _ = make_tiny_model(tmp_path, "llama_gqa", seed=5, dtype=torch.bfloat16)
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    plain = _llm(model_dir, backend, "none")
    ahead = LLM(model_dir, dtype="bfloat16", device="cuda", attention_backend=backend, block_size=16,
                num_kv_blocks=96, max_num_seqs=4, cudagraph_capture_sizes=[1, 2, 4], graph_mode="cuda",
                speculative_config=spec, async_scheduling=True)
    prompts = _prompts(3, seed=11)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=40, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy, use_tqdm=False)]
    ahead.generate(prompts, sampled, use_tqdm=False)  # captures the sampled kinds too
    assert [o.outputs[0].token_ids for o in ahead.generate(prompts, greedy, use_tqdm=False)] == want
    assert any(t["scheduled_ahead"] for t in ahead.get_step_trace())
    engine = ahead.engine
    engine.check_no_sync = True
    ahead.clear_step_trace()
    try:
        for params in (greedy, sampled):
            ahead.generate(prompts, params, use_tqdm=False)  # raises on a sync inside a launch
    finally:
        engine.check_no_sync = False
    assert any(t["scheduled_ahead"] and t["num_draft_tokens"] for t in ahead.get_step_trace())


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_plain_decode_equals_eager_and_never_waits_between_steps(model_dir, backend):
    """async_scheduling=True without speculation under graph_mode="cuda": greedy and seeded output equal
    the synchronous eager engine's, and in a steady decode batch, preparing and launching step N + 1
    (its inputs, the last tokens gathered from step N's samples on the device, the replay) never syncs
    with the host while step N is in flight."""
    eager = _llm(model_dir, backend, "none")
    ahead = LLM(model_dir, dtype="bfloat16", device="cuda", attention_backend=backend, block_size=16,
                num_kv_blocks=48, enable_prefix_caching=True, max_num_seqs=16,
                cudagraph_capture_sizes=LADDER, graph_mode="cuda", async_scheduling=True)
    prompts = _prompts(6, seed=4)
    for params in (SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True),
                   SamplingParams(temperature=0.8, top_p=0.9, seed=2, max_tokens=32, ignore_eos=True)):
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
        got = [o.outputs[0].token_ids for o in ahead.generate(prompts, params, use_tqdm=False)]
        assert got == want
    engine = ahead.engine
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, greedy)
    while engine.pending is None or any(r.num_computed_tokens < r.num_tokens - 1
                                        for r in engine.scheduler.running):
        engine.step()  # prefills (eager) and the first decode steps
    engine.check_no_sync = True
    try:
        for _ in range(8):
            engine.step()  # raises on a sync while a step is launched ahead
    finally:
        engine.check_no_sync = False
    assert any(t["scheduled_ahead"] and t["graph"] == "cuda" for t in ahead.get_step_trace())
    while engine.has_unfinished_requests():
        engine.step()


def _checked(runner):
    """Make every ``execute`` of ``runner`` raise if it waits for the device (torch's sync debug mode);
    the engine reads the output (a wait it may make) outside it."""
    execute = runner.execute

    def checked(*args, **kwargs):
        with sync_check(True, runner.device):
            return execute(*args, **kwargs)

    runner.execute = checked


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_sampled_mixed_and_speculative_steps_do_not_sync(model_dir, backend):
    """Eager steps (graph_mode="none"): seeded sampling with top-p and a penalty, prefill chunks mixed
    with decodes (requests added while others decode) and n-gram verify steps launch without a host
    sync, and give what the same engine gives unchecked."""
    def run(check: bool):
        llm = LLM(model_dir, dtype="bfloat16", device="cuda", attention_backend=backend, block_size=16,
                  num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=64, graph_mode="none",
                  speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                      "prompt_lookup_min": 1, "prompt_lookup_max": 3})
        if check:
            _checked(llm.engine.runner)
        engine, prompts = llm.engine, _prompts(6, seed=7)
        sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=20, ignore_eos=True)
        # a penalised request's steps run without drafts: it finishes early, so the others then speculate
        penalised = SamplingParams(temperature=0.7, seed=5, repetition_penalty=1.2, max_tokens=6,
                                   ignore_eos=True)
        greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
        ids = [engine.add_request(prompts[0] * 3, greedy), engine.add_request(prompts[1], sampled)]
        for i, p in enumerate(prompts[2:]):  # each joins while the others decode: mixed steps
            engine.step()
            ids.append(engine.add_request(p * 2, penalised if i % 2 else greedy))
        tokens = {}
        while engine.has_unfinished_requests():
            for request, new in engine.step():
                tokens.setdefault(request.request_id, []).extend(new)
        return [tokens[i] for i in ids], llm.get_step_trace()

    want, _ = run(check=False)
    got, trace = run(check=True)
    assert got == want
    assert any(t["num_prefill_tokens"] and t["num_decode_tokens"] for t in trace)  # mixed
    assert any(t["spec_runs"] for t in trace)  # speculative
    assert all(t["graph"] == "eager" for t in trace)

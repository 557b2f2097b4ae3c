"""Graph-ready decode on a CPU: the bucket ladder, graph_mode="compile" giving the tokens of eager steps
(batches on and between rungs, with preemption and prefix caching), padded steps that write no KV outside
the batch's own slots and leave no stale buffer tail, sampling inside the compiled step, the trace fields.

torch.compile takes seconds per bucket on a small CPU, so the tests share one compiled engine with a
three-rung ladder (and one more compile for the filtering sampler).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.worker.cudagraph import GraphKey, GraphKind, bucket_for, capture_sizes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("graphs"), "llama_gqa")
    return str(path)


LADDER = [1, 8, 16]
# 40 blocks of 4 tokens: 13 requests of up to ~45 tokens cannot all stay resident -> preemption.
SHARED = dict(num_kv_blocks=40, enable_prefix_caching=True, max_num_seqs=16, cudagraph_capture_sizes=LADDER)


def _llm(model_dir, graph_mode, **kw):
    kw = dict(dict(dtype="float32", device="cpu", attention_backend="torch", block_size=4), **kw)
    return LLM(model_dir, graph_mode=graph_mode, **kw)


@pytest.fixture(scope="module")
def eager(model_dir):
    return _llm(model_dir, "none", **SHARED)


@pytest.fixture(scope="module")
def compiled(model_dir):
    return _llm(model_dir, "compile", **SHARED)


# -- the ladder ------------------------------------------------------------------------------------
def test_default_ladder_and_padding_of_batch_17():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(13) == [1, 2, 4, 8]  # 9..13 run eager
    ladder = [1, 2, 4, 8, 16, 24, 32]
    assert bucket_for(17, ladder) == 24 and bucket_for(17, ladder) - 17 == 7
    assert bucket_for(8, ladder) == 8 and bucket_for(3, ladder) == 4
    assert bucket_for(33, ladder) is None
    assert capture_sizes(32, [16, 4, 4, 1]) == [1, 4, 16]


@pytest.mark.parametrize("kwargs,match", [
    (dict(graph_mode="warp"), "graph_mode must be one of"),
    (dict(graph_mode="cuda"), "needs a CUDA device"),
    (dict(graph_mode="compile", enforce_eager=True), "enforce_eager=True"),
    (dict(graph_mode="compile", cudagraph_capture_sizes=[0, 4]), "integers >= 1"),
    (dict(graph_mode="compile", cudagraph_capture_sizes=[128]), "exceed max_num_seqs"),
])
def test_bad_graph_options_say_what_to_do(model_dir, kwargs, match):
    mode = kwargs.pop("graph_mode")
    with pytest.raises(ValueError, match=match):
        _llm(model_dir, mode, **kwargs)


def test_enforce_eager_and_auto_on_cpu_run_eager(model_dir):
    for llm in (_llm(model_dir, "auto"), _llm(model_dir, "auto", enforce_eager=True)):
        assert llm.engine.config.graph_mode == "none" and llm.engine.runner.graphs is None


# -- compile == eager ------------------------------------------------------------------------------
def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 96, (9,), generator=g).tolist()  # a common prefix: prefix-cache hits
    return [shared + torch.randint(3, 96, (int(k),), generator=g).tolist()
            for k in torch.randint(1, 12, (n,), generator=g)]


def test_compile_greedy_tokens_equal_eager_on_and_between_rungs(eager, compiled):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    preempted = cached = 0
    for n in (1, 3, 8, 13):  # 1 and 8 on rungs, 3 and 13 between
        prompts = _prompts(n, seed=n)
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
        compiled.clear_step_trace()
        outs = compiled.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want, f"batch {n}"
        trace = compiled.get_step_trace()
        steps = [t for t in trace if t["graph"] == "compile"]
        assert steps, f"batch {n}: no decode step ran compiled"
        for t in steps:
            rows = len(t["request_ids"])
            assert t["bucket_size"] == bucket_for(rows, LADDER)
            assert t["num_padded_rows"] == t["bucket_size"] - rows
        if n in (3, 13):  # between rungs: the full batch ran padded
            assert any(t["num_padded_rows"] > 0 for t in steps)
        preempted += sum(t["num_preempted"] for t in trace)
        cached += sum(o.metrics.num_cached_prompt_tokens for o in outs)
    assert preempted > 0, "the workload was meant to preempt"
    assert cached > 0, "the shared prefix was meant to hit the prefix cache"
    assert {k.size for k in compiled.engine.runner.graphs.keys()} <= set(LADDER)  # one per bucket


def test_trace_fields_say_how_each_step_ran(model_dir, compiled):
    compiled.clear_step_trace()
    prompts = _prompts(3, seed=5) + [[7] * 30]  # the 30-token prompt is still in prefill at step 1
    compiled.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                      use_tqdm=False)
    for t in compiled.get_step_trace():
        n = len(t["request_ids"])
        if t["num_prefill_tokens"] == 0:
            want = bucket_for(n, LADDER)
            assert (t["graph"], t["bucket_size"], t["num_padded_rows"]) == ("compile", want, want - n)
        else:  # prefill or mixed: the compiled forward, attention eager (worker/compiled_forward.py)
            assert (t["graph"], t["bucket_size"], t["num_padded_rows"]) == ("piecewise", None, 0)
    plain = _llm(model_dir, "none")
    plain.generate(prompts[:1], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert {t["graph"] for t in plain.get_step_trace()} == {"eager"}


def test_sampling_with_filters_runs_inside_the_compiled_step(eager, compiled):
    params = [SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=1.2, top_p=0.9, seed=4, max_tokens=10, ignore_eos=True)]
    prompts = _prompts(2, seed=11)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    compiled.clear_step_trace()
    got = [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert any(t["graph"] == "compile" for t in compiled.get_step_trace())
    assert GraphKey(8, GraphKind.FILTER) in compiled.engine.runner.graphs.keys()


# -- padding rows ----------------------------------------------------------------------------------
def test_padded_step_writes_no_kv_outside_the_batch_slots_and_no_stale_tail(compiled):
    engine, runner = compiled.engine, compiled.engine.runner
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    g = torch.Generator().manual_seed(2)
    ids = [engine.add_request(torch.randint(3, 96, (6,), generator=g).tolist(), params)
           for _ in range(8)]
    engine.step()  # the prefills (no bucket: the compiled forward)
    assert engine.trace[-1].graph == "piecewise"
    engine.step()  # a full bucket: 8 rows, no padding
    assert (engine.trace[-1].graph, engine.trace[-1].num_padded_rows) == ("compile", 0)
    for rid in ids[5:]:
        engine.abort_request(rid)
    # Poison every slot; remember where the three remaining requests write next.
    before = [torch.full_like(c, 7.25) for c in runner.kv_caches]
    for c, p in zip(runner.kv_caches, before, strict=True):
        c.copy_(p)
    bs = engine.config.block_size
    new_slots = []
    for rid in ids[:5]:
        r, table = engine.requests[rid], engine.kv.table(rid)
        new_slots.append(table.blocks[r.num_computed_tokens // bs] * bs + r.num_computed_tokens % bs)
    engine.step()  # 5 requests in bucket 8: three padding rows
    assert (engine.trace[-1].graph, engine.trace[-1].num_padded_rows) == ("compile", 3)
    null_block = runner.kv_caches[0].shape[0] - 1
    for c, p in zip(runner.kv_caches, before, strict=True):
        changed = (c != p).flatten(3).any(-1).any(1)  # [num_blocks + 1, block_size]: slots written
        written = {int(b) * bs + int(o) for b, o in changed.nonzero() if int(b) != null_block}
        assert written == set(new_slots), "a step wrote K/V outside its requests' new slots"
    # Every row of the bucket was written this step: the rows the earlier 8-row step used are padding.
    b = runner.buffers
    assert b.seq_lens[5:8].eq(0).all() and b.slot_mapping[5:8].eq(-1).all()
    assert b.block_tables[5:8].eq(0).all() and b.temperatures[5:8].eq(0).all()
    assert b.query_start_loc[:9].tolist() == list(range(9))
    for rid in ids[:5]:
        engine.abort_request(rid)


def test_logprobs_and_penalties_after_the_replay(eager, compiled):
    prompts = _prompts(3, seed=21)
    # Logprobs are scored from the replay's raw logits: the step still replays, the scores match eager's.
    lp = SamplingParams(temperature=0.0, max_tokens=6, logprobs=2, ignore_eos=True)
    want = eager.generate(prompts, lp, use_tqdm=False)
    compiled.clear_step_trace()
    got = compiled.generate(prompts, lp, use_tqdm=False)
    assert any(t["graph"] == "compile" for t in compiled.get_step_trace())
    for w, g in zip(want, got, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for lw, lg in zip(w.outputs[0].logprobs, g.outputs[0].logprobs, strict=True):
            assert set(lw) == set(lg)
            assert all(abs(lw[t].logprob - lg[t].logprob) < 1e-4 for t in lw)
    # Penalties are applied after the forward, on the rows that ask: their decode steps still replay.
    pen = SamplingParams(temperature=0.0, max_tokens=6, repetition_penalty=1.3, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, pen, use_tqdm=False)]
    compiled.clear_step_trace()
    got = [o.outputs[0].token_ids for o in compiled.generate(prompts, pen, use_tqdm=False)]
    assert got == want
    assert {t["graph"] for t in compiled.get_step_trace()} == {"piecewise", "compile"}

"""Engine behaviour a user relies on: batch invariance, stop conditions, streaming, abort, the step trace,
and the CLI."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("engine"), "llama_gqa")
    add_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), dtype="float32", device="cpu", attention_backend="torch")


def _batch_of_16():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, 96, (int(n),), generator=g).tolist()
            for n in torch.randint(1, 40, (16,), generator=g)]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=1234, ignore_eos=True),
    SamplingParams(temperature=0.7, top_k=20, max_tokens=10, seed=99, ignore_eos=True),
], ids=["greedy", "top_p_seeded", "top_k_seeded"])
def test_batch_invariance(llm, params):
    prompts = _batch_of_16()
    together = llm.generate(prompts, params, use_tqdm=False)
    for i in (0, 5, 15):
        alone = llm.generate([prompts[i]], params, use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == together[i].outputs[0].token_ids


def test_seeded_sampling_is_reproducible_and_seed_dependent(llm):
    prompt = [5, 6, 7, 8]

    def sample(seed):
        p = SamplingParams(temperature=1.5, max_tokens=12, seed=seed, ignore_eos=True)
        return llm.generate([prompt], p, use_tqdm=False)[0].outputs[0].token_ids

    assert sample(1) == sample(1)
    assert len({tuple(sample(s)) for s in range(6)}) > 1, "different seeds should differ"


def test_top_k_one_is_greedy(llm):
    prompts = _batch_of_16()[:4]
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                          use_tqdm=False)
    top1 = llm.generate(prompts, SamplingParams(temperature=2.0, top_k=1, max_tokens=8, seed=3,
                                                ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in top1]


def test_stop_token_and_length(llm):
    prompt = [9, 10, 11]
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                stop_token_ids=[stop_at]), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == free.token_ids[:first + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_at


def test_stop_string_truncates_text(llm):
    prompt = "to be or"
    base = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert len(base.text) > 6
    stop = base.text[3:6]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                stop=stop), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == base.text[:base.text.find(stop)]
    assert len(out.token_ids) < len(base.token_ids)


def test_max_model_len_ends_the_request(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=20)
    out = llm.generate([[3] * 15], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 20


def test_streaming_yields_every_token_once(llm):
    prompts = ["the quick", "all that glitters", [4, 5, 6]]
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    expected = llm.generate(prompts, params, use_tqdm=False)
    tokens = {i: [] for i in range(3)}
    texts = {i: "" for i in range(3)}
    finals = {}
    for chunk in llm.stream(prompts, params):
        assert chunk.index not in finals, "no chunk after a request's final one"
        tokens[chunk.index] += chunk.new_token_ids
        texts[chunk.index] += chunk.new_text
        if chunk.finished:
            finals[chunk.index] = chunk.output
    for i, out in enumerate(expected):
        assert tokens[i] == out.outputs[0].token_ids
        assert texts[i] == out.outputs[0].text
        assert finals[i].outputs[0].token_ids == out.outputs[0].token_ids


def test_abort_frees_blocks_and_others_continue(llm):
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [[3, 4, 5] * 7, [6, 7] * 9, [8] * 30]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    ids = [engine.add_request(p, params) for p in prompts]
    engine.step()
    engine.step()
    engine.abort_request(ids[1])
    engine.kv.check_invariants()
    assert ids[1] not in engine.kv.tables
    while engine.has_unfinished_requests():
        engine.step()
    outs = [engine.pop_finished(r) for r in ids]
    assert outs[1].outputs[0].finish_reason == "abort"
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == [alone[0], alone[2]]
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks


def test_step_trace_and_metrics(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=6, block_size=4,
              max_model_len=24, max_num_batched_tokens=8, trace_block_tables=True)
    prompts = [[3] * 10, [4] * 7, [5] * 12]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)
    trace = llm.get_step_trace()
    assert trace and all(t["blocks_used"] + t["blocks_free"] == 6 for t in trace)
    assert all(t["num_tokens"] <= 8 for t in trace)
    for t in trace:  # without prefix sharing, the blocks in use are exactly those tables hold
        held = [b for blocks in t["block_tables"].values() for b in blocks]
        assert len(held) == len(set(held)) == t["blocks_used"]
        # occupancy is the step's peak: finished requests free their blocks only afterwards
        assert t["blocks_used_after"] <= t["blocks_used"]
        assert t["blocks_used_after"] < t["blocks_used"] or not t["finished_ids"]
        assert 0 < t["kv_slots_used"] <= t["kv_slots_allocated"] == 4 * t["blocks_used"]
        assert t["kv_slots_allocated"] - t["kv_slots_used"] < 4 * t["num_running"]  # < 1 block each
    assert any(t["num_preempted"] for t in trace) and any(t["finished_ids"] for t in trace)
    assert sum(t["num_tokens"] for t in trace) >= sum(len(p) + 7 for p in prompts)
    untraced = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=6, block_size=4,
                   max_model_len=24, max_num_batched_tokens=8)
    untraced.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)
    assert all(t["block_tables"] == {} for t in untraced.get_step_trace())  # tables cost only if asked
    for o in outs:
        m = o.metrics
        assert 0 <= m.time_to_first_token <= m.e2e_latency and m.decode_time >= 0


def test_cli_generate(model_dir, llm):
    """The CLI prints the prompt followed by what ``LLM.generate`` gives for the same seed (a seeded
    run: an unseeded one may begin with a newline, so its first line alone says nothing)."""
    proc = subprocess.run(
        [sys.executable, "-m", "minirunner", "generate", "--model", str(model_dir),
         "--max-tokens", "6", "--device", "cpu", "--seed", "1234", "the quick"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    defaults = llm.get_default_sampling_params()
    params = dataclasses.replace(defaults, max_tokens=6, seed=1234)
    text = llm.generate(["the quick"], params, use_tqdm=False)[0].outputs[0].text
    assert text.strip() and proc.stdout.startswith(f"the quick{text}\n")
    assert "tok/s" in proc.stdout.strip().splitlines()[-1]


def test_stream_stopped_early_leaves_the_engine_clean(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [[3, 4, 5] * 12, [3, 4, 5] * 12 + [9]]
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    for n, _chunk in enumerate(llm.stream(prompts, params)):
        if n == 5:
            break
    assert not llm.engine.has_unfinished_requests() and not llm.engine.requests
    pool = llm.engine.block_pool
    assert pool.num_free_blocks == pool.num_blocks
    llm.engine.kv.check_invariants()
    again = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert again == expected

"""Bad input gets a ValueError that names the problem, and nothing else a user submitted is lost."""

from __future__ import annotations

import json
import shutil

import pytest
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("bad"), "llama")
    return path


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), dtype="float32", device="cpu", max_model_len=64,
               num_kv_blocks=8, block_size=4)


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop=[""]), "stop"),
])
def test_bad_sampling_params(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("prompt, words", [
    ([], "empty"),
    ([5] * 64, "max_model_len"),
    ([5, 96, 7], "vocabulary"),
    ([5, -1], "vocabulary"),
    ("text", "tokenizer"),  # this model directory has no tokenizer
    ([1.5, 2], "token ids"),
    ([5] * 40, "KV blocks"),  # fits max_model_len but not the 8-block pool, even alone
])
def test_bad_prompt_is_refused_at_admission(llm, prompt, words):
    engine = llm.engine
    free = engine.block_pool.num_free_blocks
    with pytest.raises(ValueError, match=words):
        engine.add_request(prompt, GREEDY)
    assert not engine.has_unfinished_requests() and engine.block_pool.num_free_blocks == free


@pytest.mark.parametrize("bad, index, words", [
    ([], 1, "empty"),
    ([5] * 200, 2, "max_model_len"),
    ([5] * 40, 0, "KV blocks"),
    ([5, 96], 1, "vocabulary"),
])
def test_generate_refuses_a_batch_with_a_bad_prompt_before_any_work(llm, bad, index, words):
    """As vLLM's LLM.generate: every prompt is validated first; a bad one raises naming its index,
    nothing was queued or run (so nothing is lost), and the engine serves the next call."""
    good = [[3, 4, 5], [6, 7, 8, 9]]
    alone = [o.outputs[0].token_ids for o in llm.generate(good, GREEDY, use_tqdm=False)]
    batch = list(good)
    batch.insert(index, bad)
    steps = len(llm.engine.trace)
    with pytest.raises(ValueError, match=rf"prompt {index}\b.*{words}"):
        llm.generate(batch, GREEDY, use_tqdm=False)
    assert len(llm.engine.trace) == steps, "no engine step may run for a refused batch"
    assert not llm.engine.has_unfinished_requests() and not llm.engine.requests
    assert llm.engine.block_pool.num_free_blocks == llm.engine.block_pool.num_blocks
    assert [o.outputs[0].token_ids for o in llm.generate(good, GREEDY, use_tqdm=False)] == alone


def test_engine_level_refusal_leaves_the_other_requests_served(llm):
    """add_request raises for the bad request only; the requests already queued finish unchanged."""
    good = [[3, 4, 5], [6, 7, 8, 9]]
    alone = [o.outputs[0].token_ids for o in llm.generate(good, GREEDY, use_tqdm=False)]
    engine = llm.engine
    ids = [engine.add_request(good[0], GREEDY)]
    for bad, words in (([], "empty"), ([5] * 200, "max_model_len"), ([5] * 40, "KV blocks")):
        with pytest.raises(ValueError, match=words):
            engine.add_request(bad, GREEDY)
    ids.append(engine.add_request(good[1], GREEDY))
    while engine.has_unfinished_requests():
        engine.step()
    assert [engine.pop_finished(i).outputs[0].token_ids for i in ids] == alone
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks


def test_missing_config(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(tmp_path), device="cpu")


def test_missing_directory(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(str(tmp_path / "nope"), device="cpu")


def test_pickled_checkpoint_is_never_unpickled(model_dir, tmp_path):
    shutil.copy(model_dir / "config.json", tmp_path / "config.json")
    # A file that would run code if unpickled: loading must refuse before reading it.
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04cos\nsystem\n(S'exit 1'\ntR.")
    with pytest.raises(ValueError, match="pickled"):
        LLM(str(tmp_path), device="cpu")


def test_corrupt_safetensors(model_dir, tmp_path):
    shutil.copy(model_dir / "config.json", tmp_path / "config.json")
    data = (model_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt"):
        LLM(str(tmp_path), device="cpu")


def test_weights_not_matching_config(model_dir, tmp_path):
    shutil.copy(model_dir / "model.safetensors", tmp_path / "model.safetensors")
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="shape"):
        LLM(str(tmp_path), device="cpu")


@pytest.mark.parametrize("change, words", [
    (dict(architectures=["GPT2LMHeadModel"]), "architecture"),
    (dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0)), "yarn"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "sliding"),
    (dict(hidden_act="gelu"), "gelu"),
])
def test_unsupported_config_is_refused_by_name(model_dir, tmp_path, change, words):
    shutil.copy(model_dir / "model.safetensors", tmp_path / "model.safetensors")
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words):
        LLM(str(tmp_path), device="cpu")


def test_kv_budget_too_small_for_one_block(model_dir):
    with pytest.raises(ValueError, match="KV cache does not fit"):
        LLM(str(model_dir), device="cpu", dtype="float32", kv_cache_memory_bytes=100)


@pytest.mark.parametrize("kwargs, words", [
    (dict(block_size=0), "block_size"),
    (dict(max_model_len=10_000), "max_model_len"),
    (dict(attention_backend="cudnn"), "attention_backend"),
    (dict(dtype="int8"), "dtype"),
])
def test_bad_engine_arguments(model_dir, kwargs, words):
    with pytest.raises(ValueError, match=words):
        LLM(str(model_dir), device="cpu", **kwargs)

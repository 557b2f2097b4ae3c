"""What a checkpoint directory may hold: config.json, generation_config.json, weight and tokenizer files.

A malformed config.json field (heads 0, a negative size, a missing hidden_size, a JSON list, a rope_theta
"abc" or 0, a nested eos_token_id) raises ValueError naming the file and the field, before anything is
built. In generation_config.json a bad field we use (NaN temperature, an infinite top_p, a nested
eos_token_id) raises ValueError naming the file and the field; a file that is not JSON is ignored with a
warning (no defaults). Integer-dtype weights are refused, not cast. A FIFO named model.safetensors (or
tokenizer.json) is refused at once instead of blocking the read forever. A prompt with a lone surrogate
raises ValueError naming the prompt, and ``start_profile()`` without a folder writes into a fresh private
one, never into a fixed shared name.
"""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams

BASE = dict(device="cpu", attention_backend="torch", num_threads=1, num_kv_blocks=16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("config_validation"), "llama_gqa")[0]
    add_tokenizer(path)
    return path


def _copy(src, dst, replace: dict | None = None):
    """dst: links to src's files, except the names in ``replace`` (name -> text, or None to drop)."""
    dst.mkdir()
    replace = replace or {}
    for f in src.iterdir():
        if f.name not in replace:
            (dst / f.name).symlink_to(f)
    for name, text in replace.items():
        if text is not None:
            (dst / name).write_text(text)
    return dst


def _config(model_dir, **changes) -> str:
    cfg = json.loads((model_dir / "config.json").read_text())
    for key, value in changes.items():
        if value is ...:
            cfg.pop(key)
        else:
            cfg[key] = value
    return json.dumps(cfg)


@pytest.mark.parametrize("field, value", [
    ("num_attention_heads", 0), ("num_key_value_heads", 0), ("hidden_size", -64),
    ("intermediate_size", "96"), ("vocab_size", 96.0), ("num_hidden_layers", True),
    ("hidden_size", ...), ("rope_theta", "abc"), ("rope_theta", 0), ("rms_norm_eps", float("nan")),
    ("max_position_embeddings", 0), ("eos_token_id", [[1]]), ("num_key_value_heads", 3),
    ("tie_word_embeddings", "yes"),
])
def test_a_malformed_config_field_is_refused_naming_the_file_and_field(model_dir, tmp_path, field, value):
    path = _copy(model_dir, tmp_path / "m", {"config.json": _config(model_dir, **{field: value})})
    with pytest.raises(ValueError, match=rf"config\.json.*{field}") as info:
        LLM(path, **BASE)
    assert str(path) in str(info.value)


def test_a_config_that_is_a_json_list_is_refused_naming_the_file(model_dir, tmp_path):
    path = _copy(model_dir, tmp_path / "m", {"config.json": "[1, 2]"})
    with pytest.raises(ValueError, match=r"config\.json.*JSON object"):
        LLM(path, **BASE)


def _generation(model_dir, tmp_path, text: str):
    return _copy(model_dir, tmp_path / "m", {"generation_config.json": text})


@pytest.mark.parametrize("field, value", [
    ("temperature", float("nan")), ("top_p", float("inf")), ("min_p", -0.5),
    ("repetition_penalty", float("-inf")), ("top_k", 2.5), ("max_new_tokens", "64"),
    ("temperature", "hot"), ("eos_token_id", [[1]]),
])
def test_a_bad_generation_config_field_is_refused_naming_the_file_and_field(model_dir, tmp_path,
                                                                             field, value):
    path = _generation(model_dir, tmp_path, json.dumps({field: value}))
    with pytest.raises(ValueError, match=rf"generation_config\.json.*{field}"):
        LLM(path, **BASE)


def test_an_unreadable_generation_config_means_no_defaults_with_a_warning(model_dir, tmp_path, caplog):
    path = _generation(model_dir, tmp_path, "{not json")
    with caplog.at_level(logging.WARNING):
        llm = LLM(path, **BASE)
    assert llm.get_default_sampling_params() == SamplingParams()
    assert "generation_config.json" in caplog.text


def test_integer_weights_are_refused_not_cast(model_dir, tmp_path):
    tensors = load_file(model_dir / "model.safetensors")
    name = next(n for n in tensors if n.endswith("q_proj.weight"))
    tensors[name] = (tensors[name] * 100).to(torch.int32)
    path = _copy(model_dir, tmp_path / "m", {"model.safetensors": None})
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{name}.*I32"):
        LLM(path, **BASE)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_fifo_in_place_of_a_checkpoint_file_is_refused_at_once(model_dir, tmp_path, name):
    path = _copy(model_dir, tmp_path / "m", {name: None})
    os.mkfifo(path / name)
    assert stat.S_ISFIFO(os.stat(path / name).st_mode)
    with pytest.raises(ValueError, match=rf"{name}.*not regular files"):
        LLM(path, **BASE)


def test_a_prompt_with_a_lone_surrogate_is_refused_naming_the_prompt(model_dir):
    llm = LLM(model_dir, **BASE)
    with pytest.raises(ValueError, match=r"prompt 1 .*surrogate"):
        llm.generate(["the fox", "the \ud800 dog"], SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.generate(["the fox"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs


def test_the_profiler_writes_into_a_fresh_private_folder(model_dir, monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # tempfile reads it on first use only: reset below
    monkeypatch.setattr("tempfile.tempdir", None)
    planted = tmp_path / "minirunner_profile"  # the fixed name an attacker could plant a link at
    planted.symlink_to(tmp_path / "elsewhere")
    llm = LLM(model_dir, **BASE)
    paths = []
    for _ in range(2):
        llm.start_profile()
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
        paths.append(llm.stop_profile())
    folders = {p.parent for p in paths}
    assert len(folders) == 2 and planted not in folders
    for folder in folders:
        assert folder.parent == tmp_path and not folder.is_symlink()
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not (tmp_path / "elsewhere").exists()


def test_the_engine_resolves_a_copy_and_leaves_the_given_config_as_given(model_dir):
    """What "auto" / None leave open (graph mode, max_model_len, the capture ladder) is decided on a copy
    the engine keeps; the EngineConfig a caller built is not changed under it."""
    from minirunner.config import EngineConfig, ModelConfig
    from minirunner.engine.engine import LLMEngine

    given = EngineConfig(model=str(model_dir), dtype=torch.float32, device=torch.device("cpu"),
                         num_kv_blocks=16, graph_mode="auto", max_model_len=None,
                         cudagraph_capture_sizes=[4, 1, 4])
    engine = LLMEngine(given, ModelConfig.from_dir(str(model_dir)))
    assert (given.graph_mode, given.max_model_len, given.cudagraph_capture_sizes) == ("auto", None, [4, 1, 4])
    cfg = engine.config
    assert cfg.graph_mode == "none"  # auto on a CPU
    assert cfg.max_model_len == ModelConfig.from_dir(str(model_dir)).max_position_embeddings
    assert cfg.cudagraph_capture_sizes == [1, 4]

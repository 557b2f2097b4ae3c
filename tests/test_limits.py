"""Sizes, counts and seeds an LLM refuses before it allocates anything (minirunner/limits.py).

Each refusal is a ValueError naming the option, raised by the size checks before any large list or
tensor exists: KV blocks or a KV byte budget beyond the machine's memory, step sizes whose buffers
could never fit, a config whose max_position_embeddings makes the block tables too large, more layers
in config.json than the checkpoint holds, non-integer sizes (a float, a string, a bool taken as 1), CPU
threads far beyond the cores, seeds outside [0, 2**63), an explicit tokenizer directory that does not
exist, and ``n`` above its bound (where ``n`` at the bound still returns all its completions).
"""

from __future__ import annotations

import json
import math

import pytest
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.limits import MAX_N

BASE = dict(device="cpu", attention_backend="torch", num_threads=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("limits"), "llama_gqa")[0]


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, num_kv_blocks=2 * MAX_N, max_num_seqs=256, **BASE)


@pytest.mark.parametrize("option, value", [
    ("num_kv_blocks", 10**9),
    ("kv_cache_memory_bytes", 10**15),
    ("max_num_batched_tokens", 10**9),
    ("max_num_seqs", 10**9),
    ("block_size", 1.5), ("block_size", "16"), ("block_size", True),
    ("num_kv_blocks", 2.5), ("num_kv_blocks", True),
    ("max_num_seqs", True), ("max_num_batched_tokens", 64.0), ("max_model_len", "64"),
    ("kv_cache_memory_bytes", 1.5e6),
    ("num_threads", 10**6), ("num_threads", True),
    ("seed", 2**63), ("seed", 2**200), ("seed", -2), ("seed", 1.0),
    ("gpu_memory_utilization", math.nan),
    ("tokenizer", "no/such/tokenizer/dir"),
])
def test_an_impossible_engine_size_is_refused_naming_the_option(model_dir, option, value):
    with pytest.raises(ValueError, match=option):
        LLM(model_dir, **{**BASE, option: value})


def _edit_config(src, dst, **changes):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_a_huge_max_position_embeddings_without_max_model_len_is_refused(model_dir, tmp_path):
    path = _edit_config(model_dir, tmp_path / "long", max_position_embeddings=10**9)
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(path, **BASE)
    # the same checkpoint with a sane max_model_len serves
    out = LLM(path, max_model_len=64, num_kv_blocks=16, **BASE).generate(
        [[5, 6, 7]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_more_layers_in_config_than_in_the_checkpoint_is_refused_before_building(model_dir, tmp_path):
    path = _edit_config(model_dir, tmp_path / "deep", num_hidden_layers=100000)
    with pytest.raises(ValueError, match="num_hidden_layers=100000.*2 layers"):
        LLM(path, num_kv_blocks=16, **BASE)


def test_n_above_the_bound_is_refused_and_n_at_the_bound_returns_every_completion(llm):
    with pytest.raises(ValueError, match=f"n={MAX_N + 1}.*{MAX_N}"):
        llm.generate([[5, 6, 7]], SamplingParams(n=MAX_N + 1, max_tokens=2), use_tqdm=False)
    out = llm.generate([[5, 6, 7]], SamplingParams(n=MAX_N, max_tokens=2, seed=3, ignore_eos=True),
                       use_tqdm=False)[0]
    assert sorted(c.index for c in out.outputs) == list(range(MAX_N))
    assert all(len(c.token_ids) == 2 for c in out.outputs)


@pytest.mark.parametrize("seed", [2**63, 2**64 + 5, -2])
def test_a_request_seed_outside_int64_is_refused_naming_the_seed(llm, seed):
    with pytest.raises(ValueError, match=r"prompt 0 .*seed"):
        llm.generate([[5, 6, 7]], SamplingParams(seed=seed, max_tokens=2), use_tqdm=False)


def test_engine_seed_minus_one_means_unseeded_and_the_largest_seed_serves(model_dir):
    for seed in (-1, 2**63 - 1):
        out = LLM(model_dir, seed=seed, num_kv_blocks=16, **BASE).generate(
            [[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 2

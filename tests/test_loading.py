"""Loading: checkpoints saved in float32 / bfloat16 / float16 run in the dtype asked for, and the KV
budget turns bytes into blocks by the KV-per-token formula."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from tiny_models import make_tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from minirunner import LLM, SamplingParams
from minirunner.config import ModelConfig
from minirunner.model.loader import load_model
from minirunner.worker.memory_profile import kv_budget_from_profile, run_profiling_step

PROMPT = [5, 17, 33, 8, 61, 2, 40, 9, 11]


@pytest.mark.parametrize("saved, run", [
    (torch.bfloat16, "bfloat16"), (torch.float16, "float16"), (torch.bfloat16, "float32")])
def test_half_precision_checkpoints(tmp_path, saved, run):
    path, _ = make_tiny_model(tmp_path, "qwen3", dtype=saved)
    llm = LLM(str(path), dtype=run, device="cpu")
    dtype = getattr(torch, run)
    assert llm.engine.model.lm_head.weight.dtype == dtype
    assert llm.engine.runner.kv_caches[0].dtype == dtype
    engine = llm.engine
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=1))
    got = engine.execute_step().runner_output.first_logits()[rid]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT])).logits[0, -1].float()
    # Same weights and dtype; only the order of floating-point operations differs.
    tol = 1e-4 if dtype == torch.float32 else 0.05 * ref.abs().max().item()
    torch.testing.assert_close(got, ref, atol=tol, rtol=0)


def test_auto_dtype_on_cpu_is_float32(tmp_path):
    path, _ = make_tiny_model(tmp_path, "llama", dtype=torch.bfloat16)
    assert LLM(str(path), device="cpu").engine.config.dtype == torch.float32


def test_tied_embeddings_share_storage(tmp_path):
    path, _ = make_tiny_model(tmp_path, "llama_gqa")  # tie_word_embeddings=True
    model = LLM(str(path), device="cpu").engine.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("block_size", [4, 16])
def test_kv_budget_in_bytes(tmp_path, block_size):
    path, model = make_tiny_model(tmp_path, "qwen3")  # head_dim 24 != hidden / heads
    cfg = model.config
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # fp32
    budget = 1_000_000
    llm = LLM(str(path), dtype="float32", device="cpu", block_size=block_size,
              kv_cache_memory_bytes=budget)
    # the tensors hold the whole budget: the pool's blocks plus the runner's null block
    assert llm.engine.num_kv_blocks == budget // (per_token * block_size) - 1
    kv = llm.engine.runner.kv_caches
    assert len(kv) == cfg.num_hidden_layers
    assert kv[0].shape == (budget // (per_token * block_size), 2, block_size,
                           cfg.num_key_value_heads, cfg.head_dim)


def test_cpu_threads(tmp_path):
    import torch

    path, _ = make_tiny_model(tmp_path, "llama")
    before = torch.get_num_threads()
    try:
        assert LLM(str(path), device="cpu", num_threads=2).engine.num_threads == 2
        assert LLM(str(path), device="cpu", num_threads=1).engine.num_threads == 1
        assert LLM(str(path), device="cpu").engine.num_threads == len(os.sched_getaffinity(0))  # "auto"
        with pytest.raises(ValueError, match="num_threads"):
            LLM(str(path), device="cpu", num_threads=0)
    finally:
        torch.set_num_threads(before)


class _AllocationLog(TorchDispatchMode):
    """Records the dtype and size of every real (non-meta) floating tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.made: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.is_floating_point():
                self.made.append((t.dtype, t.numel()))
        return out


def test_bf16_checkpoint_loads_without_a_float32_copy(tmp_path):
    path, hf = make_tiny_model(tmp_path, "llama", dtype=torch.bfloat16)
    config = ModelConfig.from_dir(path)
    log = _AllocationLog()
    with log:
        model = load_model(path, config, torch.bfloat16, torch.device("cpu"))
    biggest = max(p.numel() for p in hf.parameters())
    fp32 = [n for dtype, n in log.made if dtype == torch.float32]
    # Only RoPE's inverse frequencies (head_dim / 2 values) are float32, by design.
    assert max(fp32, default=0) <= config.head_dim, f"float32 tensors made while loading: {fp32}"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in hf.parameters())
    assert biggest > config.head_dim


def test_profiling_step_runs_the_largest_batch_and_budget_arithmetic(tmp_path):
    path, _ = make_tiny_model(tmp_path, "qwen2")
    llm = LLM(str(path), dtype="float32", device="cpu", max_num_seqs=5,
              max_num_batched_tokens=23, block_size=4)
    sampled, kv_bytes = run_profiling_step(llm.engine.model, llm.engine.config,
                                           llm.engine.model_config)
    # 23 tokens over 5 sequences of 5, 5, 5, 5, 3 tokens: 2 + 2 + 2 + 2 + 1 blocks, a token each.
    assert len(sampled) == 5 and all(0 <= t < 96 for t in sampled)
    # the throwaway cache holds those 9 blocks and the null block
    assert kv_bytes == 10 * 4 * llm.engine.model_config.kv_bytes_per_token(torch.float32)
    assert kv_budget_from_profile(total=80 << 30, utilization=0.9, peak=10 << 30,
                                  non_torch=1 << 30) == int(0.9 * (80 << 30)) - (11 << 30)

"""The triton attention backend against the torch backend: per layer call (mixed prefill/decode
batch and a decode-only batch), and end to end through ``LLM`` with identical greedy tokens."""

from __future__ import annotations

import os

import pytest
import torch
from attention_meta import make_meta
from tiny_models import make_tiny_model

from minirunner.attention import get_backend_class
from minirunner.kernels.testing import random_paged_batch

# The Triton kernels run on CPU tensors only in the interpreter, which tests/conftest.py turns on when
# CUDA is absent; on a CUDA machine the gpu-marked tests cover the compiled kernels instead.
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1")


@pytest.mark.parametrize("seq_lens,query_lens", [
    ([21, 5, 1], [4, 5, 1]),        # extend, whole prompt, single token: the prefill kernel
    ([21, 17, 0, 3], [1, 1, 1, 1]),  # uniform decode with a CUDA-graph padding row
])
@needs_interpreter
def test_backend_forward_matches_torch_backend(seq_lens, query_lens):
    """Writes this step's K/V into the cache, then attends: output and resulting cache both match."""
    hq, hkv, d, bs = 4, 2, 64, 16
    batch_q_lens = [min(s, n) for s, n in zip(seq_lens, query_lens, strict=True)]
    b = random_paged_batch(seq_lens, batch_q_lens, hq, hkv, d, bs)
    meta = make_meta(seq_lens, query_lens, b.block_tables, bs)
    q = torch.randn(meta.num_tokens, hq, d)
    k, v = torch.randn(meta.num_tokens, hkv, d), torch.randn(meta.num_tokens, hkv, d)
    outs, caches = [], []
    for name in ("torch", "triton"):
        backend = get_backend_class(name)(hq, hkv, d, d**-0.5, bs, torch.device("cpu"),
                                          torch.float32)
        # the runner's layout: the pool's blocks, then the null block padding rows may write to
        cache = torch.cat([b.kv_cache, torch.zeros_like(b.kv_cache[:1])])
        backend.plan(meta)
        outs.append(backend.forward(q, k, v, cache, meta))
        caches.append(cache[:-1])
    assert meta.is_decode_only == all(n == 1 for n in query_lens)
    assert torch.equal(caches[0], caches[1])
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("tiny_llama"), "llama_gqa")
    return str(path)


@needs_interpreter
def test_llm_triton_backend_gives_torch_backend_greedy_tokens(tiny_llama_dir):
    from minirunner import LLM, SamplingParams

    prompts = [[1, 2, 3], [4, 5, 6, 7], list(range(10, 30))]  # the last spans two 16-token blocks
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(model=tiny_llama_dir, dtype="float32", attention_backend=backend)
        assert llm.engine.backend.name == backend
        outs = llm.generate(prompts, params, use_tqdm=False)
        tokens[backend] = [o.outputs[0].token_ids for o in outs]
    assert all(len(t) == 8 for t in tokens["torch"])
    assert tokens["triton"] == tokens["torch"]


def test_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        get_backend_class("triton")(4, 2, 64, 0.125, 16, torch.device("cpu"), torch.float32)

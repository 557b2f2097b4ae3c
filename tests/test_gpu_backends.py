"""Attention backends on a CUDA GPU: FlashInfer against the torch backend (skipped when flashinfer is
not installed), and end-to-end greedy equality of the triton and torch backends. Skipped without
CUDA."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from attention_meta import make_meta
from tiny_models import make_tiny_model

from minirunner.attention import get_backend_class
from minirunner.kernels.testing import random_paged_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
needs_flashinfer = pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                                      reason="flashinfer-python is not installed")


@needs_flashinfer
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq_lens,query_lens", [
    ([300, 17, 0, 64], [1, 1, 1, 1]),            # uniform decode with a CUDA-graph padding row
    ([300, 17, 0, 64], [1, 1, 0, 1]),            # a padding row without queries (prefill path)
    ([300, 40, 16, 9], [300, 4, 16, 1]),         # prefill, spec-verify extend and decode mixed
])
def test_flashinfer_matches_torch_backend(dtype, seq_lens, query_lens):
    hq, hkv, d, bs = 32, 8, 128, 16
    batch_q_lens = [min(s, n) for s, n in zip(seq_lens, query_lens, strict=True)]
    b = random_paged_batch(seq_lens, batch_q_lens, hq, hkv, d, bs, dtype, "cuda")
    meta = make_meta(seq_lens, query_lens, b.block_tables, bs)
    k = torch.randn(meta.num_tokens, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(meta.num_tokens, hq, d, device="cuda", dtype=dtype)
    outs, caches = [], []
    for name in ("torch", "flashinfer"):
        backend = get_backend_class(name)(hq, hkv, d, d**-0.5, bs, torch.device("cuda"), dtype)
        cache = b.kv_cache.clone()
        backend.plan(meta)
        outs.append(backend.forward(q, k, v, cache, meta))
        caches.append(cache)
    assert torch.equal(caches[0], caches[1])
    tol = 5e-3 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=tol, rtol=tol)


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("tiny_llama_gpu"), "llama_gqa")
    return str(path)


def test_llm_triton_equals_torch_greedy_on_gpu(tiny_llama_dir):
    from minirunner import LLM, SamplingParams

    prompts = [[1, 2, 3], [4, 5, 6, 7], list(range(10, 50))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(model=tiny_llama_dir, dtype="float32", device="cuda",
                  attention_backend=backend, num_kv_blocks=64)
        assert llm.engine.backend.name == backend
        outs = llm.generate(prompts, params, use_tqdm=False)
        tokens[backend] = [o.outputs[0].token_ids for o in outs]
        del llm
    assert tokens["triton"] == tokens["torch"]

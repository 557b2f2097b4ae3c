"""RejectionSampler (spec_decode/rejection_sampler.py): the one entry to the rejection sampler for the eager
and the graph verify step. It picks the twin on a CPU and the Triton kernel where asked (interpreter on
CPU), both giving the same runs; an all-greedy batch's one-argmax rule gives the runs the full sampler
gives at temperature 0, ragged and uniform; and on CUDA (gpu-marked) its default, the compiled kernel,
equals the twin."""

from __future__ import annotations

import os

import pytest
import torch
from test_kernels_rejection import _batch

from minirunner.kernels.rejection_sampling import rejection_sample, rejection_sample_ref
from minirunner.spec_decode.rejection_sampler import RejectionSampler, emitted_runs

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1")
K = [0, 3, 1, 5, 2, 0, 4, 1, 3, 2]
MIXED = dict(temps=[0, 1, .7, 1.3, 0, 1, .9, .5, 1, 0], top_k=[-1, -1, 5, -1, -1, -1, 10, -1, 1, -1],
             top_p=[1, .9, 1, 1, 1, 1, .8, 1, 1, 1])


def _args(batch: dict) -> tuple:
    return tuple(batch[name] for name in ("draft_token_ids", "cu_num_draft_tokens", "draft_probs",
                                          "target_logits", "temperatures", "top_k", "top_p", "seeds",
                                          "positions"))


def test_cpu_default_is_the_twin():
    assert RejectionSampler(torch.device("cpu")).kernel is rejection_sample_ref


@needs_interpreter
@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "ngram_one_hot"])
def test_kernel_and_twin_emit_the_same_runs(one_hot):
    batch = _batch(K, 131, seed=5, **MIXED)
    if one_hot:
        batch["draft_probs"] = None
    triton = RejectionSampler(torch.device("cpu"), triton=True)
    assert triton.kernel is rejection_sample
    got = triton(*_args(batch))
    want = RejectionSampler(torch.device("cpu"))(*_args(batch))
    assert torch.equal(got, want)
    runs = emitted_runs(want)
    assert [len(r) for r in runs] == (want >= 0).sum(1).tolist()
    assert all(1 <= len(r) <= k + 1 for r, k in zip(runs, K, strict=True))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("uniform", [False, True])
def test_all_greedy_rule_gives_the_samplers_runs(seed, uniform):
    """temperature 0 everywhere: the one-argmax rule and the full sampler emit the same runs, including
    drafts that equal the target's argmax (accepted) and rows with no drafts (the bonus token only)."""
    k = [2] * 6 if uniform else [0, 3, 1, 4, 0, 2]
    batch = _batch(k, 50, seed=seed, temps=[0.0] * 6)
    logits, cu = batch["target_logits"], batch["cu_num_draft_tokens"]
    # make about half of the drafts the target's argmax, so runs accept some and reject some
    req = torch.repeat_interleave(torch.arange(6), torch.tensor(k))
    argmax = logits[torch.arange(int(cu[-1])) + req].argmax(-1)
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(argmax.shape, generator=g) < 0.6
    batch["draft_token_ids"] = torch.where(keep, argmax, batch["draft_token_ids"])
    sampler = RejectionSampler(torch.device("cpu"))
    uniform_k = 2 if uniform else None
    want = sampler(*_args(batch), uniform_k=uniform_k)
    got = sampler(*_args(batch), uniform_k=uniform_k, all_greedy=True)
    assert torch.equal(got, want)
    lengths = (want >= 0).sum(1)
    assert lengths.min() < lengths.max() or not any(k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "ngram_one_hot"])
@pytest.mark.parametrize("uniform", [False, True])
def test_cuda_default_kernel_equals_the_twin(one_hot, uniform):
    """On CUDA the default is the compiled Triton kernel; its runs equal the twin's (vocab past one
    block of the kernel's vocabulary loop, greedy, sampled, top-k and top-p rows mixed)."""
    k = [3] * 10 if uniform else K
    batch = {name: t.cuda() if isinstance(t, torch.Tensor) else t
             for name, t in _batch(k, 5003, seed=7, **MIXED).items()}
    if one_hot:
        batch["draft_probs"] = None
    kernel = RejectionSampler(torch.device("cuda"))
    assert kernel.kernel is rejection_sample
    uniform_k = 3 if uniform else None
    got = kernel(*_args(batch), uniform_k=uniform_k)
    want = RejectionSampler(torch.device("cuda"), triton=False)(*_args(batch), uniform_k=uniform_k)
    assert torch.equal(got, want)

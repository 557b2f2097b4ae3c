"""Sampling: the Triton Gumbel-max kernel (interpreter on CPU) against its torch twin, plus the
behaviour a user relies on: greedy at T=0, seeded reproducibility independent of the batch, top-k,
and frequencies that follow softmax(logits / T)."""

from __future__ import annotations

import os

import pytest
import torch

from minirunner.kernels.sampling import apply_top_k_top_p, sample, sample_ref

# The Triton kernels run on CPU tensors only in the interpreter, which tests/conftest.py turns on when
# CUDA is absent; on a CUDA machine the gpu-marked tests cover the compiled kernels instead.
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1")


def _rows(n, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen) * 3
    temps = torch.rand(n, generator=gen) * 1.5 + 0.1
    seeds = torch.randint(-(2**62), 2**62, (n,), generator=gen, dtype=torch.int64)
    positions = torch.randint(0, 10**6, (n,), generator=gen, dtype=torch.int64)
    top_k = torch.full((n,), -1, dtype=torch.int64)
    top_p = torch.ones(n)
    return logits, temps, top_k, top_p, seeds, positions


@needs_interpreter
@pytest.mark.parametrize("vocab,dtype", [(1000, torch.float32), (5000, torch.bfloat16),
                                         (131, torch.float16)])
def test_triton_sample_equals_twin(vocab, dtype):
    logits, temps, top_k, top_p, seeds, positions = _rows(48, vocab)
    temps[:6] = 0.0  # greedy rows
    logits = logits.to(dtype)
    got = sample(logits, temps, top_k, top_p, seeds, positions)
    want = sample_ref(logits, temps, top_k, top_p, seeds, positions)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)
    assert torch.equal(got[:6], logits[:6].float().argmax(-1))


@needs_interpreter
def test_triton_sample_with_top_k_top_p_equals_twin():
    logits, temps, top_k, top_p, seeds, positions = _rows(48, 700, seed=1)
    top_k[::3] = 5
    top_p[1::3] = 0.6
    top_k[2::6] = 1  # top-k 1 is greedy whatever the temperature
    got = sample(logits, temps, top_k, top_p, seeds, positions)
    want = sample_ref(logits, temps, top_k, top_p, seeds, positions)
    assert torch.equal(got, want)
    assert torch.equal(got[2::6], logits[2::6].argmax(-1))
    # every top-k-5 row drew from its own 5 largest logits
    top5 = logits[::3].topk(5, dim=-1).indices
    assert torch.all((top5 == got[::3, None]).any(-1))


@needs_interpreter
def test_same_seed_and_position_give_same_token_in_any_batch():
    logits, temps, top_k, top_p, seeds, positions = _rows(16, 300, seed=2)
    full = sample(logits, temps, top_k, top_p, seeds, positions)
    perm = torch.randperm(16)[:7]
    part = sample(logits[perm], temps[perm], top_k[perm], top_p[perm], seeds[perm], positions[perm])
    assert torch.equal(part, full[perm])


def test_frequencies_follow_softmax():
    """4000 draws (one seed, 4000 positions) of a 4-token distribution at T=0.7: each token's
    frequency is within 5 standard errors of softmax(logits / T). Checked on the twin (4000
    interpreter programs would take ~30 s); the kernel's tokens equal the twin's above."""
    n = 4000
    row = torch.tensor([1.0, 0.0, -0.5, 2.0])
    logits = row.expand(n, 4).contiguous()
    temps = torch.full((n,), 0.7)
    tokens = sample_ref(logits, temps, torch.full((n,), -1), torch.ones(n),
                torch.full((n,), 1234, dtype=torch.int64), torch.arange(n))
    freq = torch.bincount(tokens, minlength=4).float() / n
    p = torch.softmax(row / 0.7, dim=0)
    se = (p * (1 - p) / n).sqrt()
    assert torch.all((freq - p).abs() < 5 * se), (freq, p)


def test_top_p_one_keeps_whole_vocabulary():
    """top_p = 1.0 means off: no token is cut, however small its probability."""
    logits = torch.tensor([[30.0, 0.0, -5.0, -40.0, -80.0]])
    masked = apply_top_k_top_p(logits, torch.tensor([-1]), torch.tensor([1.0]))
    assert torch.equal(masked, logits)
    masked = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isinf(masked[0, 2:]).all() and torch.equal(masked[0, :2], logits[0, :2])

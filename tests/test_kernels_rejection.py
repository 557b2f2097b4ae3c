"""Rejection sampling: the Triton kernel (interpreter on CPU, fp32) against its torch twin, greedy
behaviour, equality with plain sampling when there are no drafts, and losslessness by a chi-square
goodness-of-fit test of the first and second emitted tokens (draft-model q and n-gram one-hot q), which a
deliberately broken sampler fails."""

from __future__ import annotations

import os

import pytest
import torch

import minirunner.kernels.rejection_sampling_ref as rs
from minirunner.kernels.rejection_sampling import probs_from_logits, rejection_sample, rejection_sample_ref
from minirunner.kernels.sampling import sample_ref

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1")


def _batch(k, vocab, seed=0, temps=None, top_k=None, top_p=None):
    """Random target logits for k_i + 1 rows per request; drafts drawn from a q near p."""
    g = torch.Generator().manual_seed(seed)
    k = torch.tensor(k)
    B = len(k)
    cu = k.cumsum(0)
    D = int(cu[-1])
    logits = torch.randn(D + B, vocab, generator=g) * 2
    temps = torch.rand(B, generator=g) + 0.3 if temps is None else torch.tensor(temps)
    top_k = torch.full((B,), -1) if top_k is None else torch.tensor(top_k)
    top_p = torch.ones(B) if top_p is None else torch.tensor(top_p)
    seeds = torch.randint(-(2**62), 2**62, (B,), generator=g)
    positions = torch.randint(0, 10**5, (B,), generator=g)
    req = torch.repeat_interleave(torch.arange(B), k)
    rows = torch.arange(D) + req
    q = probs_from_logits(logits[rows] + torch.randn(D, vocab, generator=g) * 0.7, temps[req],
                          top_k[req], top_p[req])
    drafts = torch.multinomial(q, 1, generator=g)[:, 0]
    return dict(draft_token_ids=drafts, cu_num_draft_tokens=cu, draft_probs=q, target_logits=logits,
                temperatures=temps, top_k=top_k, top_p=top_p, seeds=seeds, positions=positions)


@needs_interpreter
@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "ngram_one_hot"])
@pytest.mark.parametrize("vocab", [67, 300])
def test_kernel_equals_twin(vocab, one_hot):
    k = [0, 3, 1, 5, 2, 0, 4, 1, 3, 2]
    args = _batch(k, vocab, seed=vocab, temps=[0, 1, .7, 1.3, 0, 1, .9, .5, 1, 0],
                  top_k=[-1, -1, 5, -1, -1, -1, 10, -1, 1, -1],
                  top_p=[1, .9, 1, 1, 1, 1, .8, 1, 1, 1])
    if one_hot:
        args["draft_probs"] = None
    want = rejection_sample_ref(**args)
    got = rejection_sample(**args)
    assert got.dtype == torch.int64 and got.shape == (10, 6)
    assert torch.equal(got, want)
    # each row: 1..k_i+1 tokens, then -1 padding
    lengths = (want >= 0).sum(1)
    assert torch.all((lengths >= 1) & (lengths <= torch.tensor(k) + 1))
    assert torch.all(want[:, :1] >= 0)


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "ngram_one_hot"])
@pytest.mark.parametrize("k", [1, 3])
def test_uniform_k_path_gives_the_general_paths_runs(k, one_hot):
    """The graph-mode verify step's form (uniform_k: static indices, no host read) emits the runs of the
    general path, greedy and sampling rows mixed (tests/test_spec_graphs.py runs it compiled)."""
    B = 8
    args = _batch([k] * B, 97, seed=k, temps=[0, 1, .7, 0, 1.3, .9, 0, 1],
                  top_k=[-1, -1, 5, -1, -1, 10, -1, -1], top_p=[1, .9, 1, 1, 1, .8, 1, 1])
    if one_hot:
        args["draft_probs"] = None
    want = rejection_sample_ref(**args)
    assert torch.equal(rejection_sample_ref(**args, uniform_k=k), want)
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert torch.equal(rejection_sample(**args, uniform_k=k), want)
    assert ((want >= 0).sum(1) >= 1).all() and (want[:, 0] >= 0).all()
    assert len(set((want >= 0).sum(1).tolist())) > 1  # some rows accept more than others



@pytest.mark.parametrize("greedy", [False, True], ids=["mixed", "all_greedy"])
def test_max_k_from_the_host_gives_the_runs_read_from_the_device(greedy):
    """An eager verify step passes its most drafts per request from the host (``max_k``: on CUDA nothing
    is read back); the runs are those the general path sizes by reading ``cu_num_draft_tokens``."""
    k = [0, 3, 1, 5, 2]
    temps = [0] * 5 if greedy else [0, 1, .7, 1.3, 0]
    args = _batch(k, 61, seed=4, temps=temps)
    want = rejection_sample_ref(**args)
    assert want.shape == (5, 6)
    assert torch.equal(rejection_sample_ref(**args, max_k=5), want)
    if greedy:
        greedy_args = {n: args[n] for n in ("draft_token_ids", "cu_num_draft_tokens", "target_logits")}
        assert torch.equal(rs.greedy_rejection_sample(**greedy_args, max_k=5), want)
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert torch.equal(rejection_sample(**args, max_k=5), want)

def test_no_drafts_is_plain_sampling():
    """With k = 0 every request emits exactly the token plain sampling draws at that position."""
    args = _batch([0] * 12, 200, seed=3, temps=[0, 1, .7, 1.3] * 3, top_k=[-1, 5, -1, 20] * 3,
                  top_p=[1, 1, .8, 1] * 3)
    out = rejection_sample_ref(**args)
    plain = sample_ref(args["target_logits"], args["temperatures"], args["top_k"], args["top_p"],
                       args["seeds"], args["positions"])
    assert out.shape == (12, 1)
    assert torch.equal(out[:, 0], plain)


def test_greedy_accepts_the_matching_prefix_then_emits_the_target_token():
    vocab = 50
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4 + 1 + 3 + 1, vocab, generator=g)
    argmax = logits.argmax(-1)
    # request 0: 4 drafts, the first two match the target's argmax, the third does not
    d0 = argmax[:4].clone()
    d0[2] = (d0[2] + 1) % vocab
    # request 1: 3 drafts, all match: the bonus token (argmax of its 4th row) is emitted too
    d1 = argmax[5:8].clone()
    out = rejection_sample_ref(torch.cat([d0, d1]), torch.tensor([4, 7]), None, logits,
                               torch.zeros(2), torch.full((2,), -1), torch.ones(2),
                               torch.tensor([1, 2]), torch.tensor([10, 20]))
    argmax = argmax.tolist()
    assert out[0].tolist() == [argmax[0], argmax[1], argmax[2], -1, -1]
    assert out[1].tolist() == [argmax[5], argmax[6], argmax[7], argmax[8], -1]


# ---------------------------------------------------------------------------------------------
# Losslessness: a bigram "model" over a tiny vocabulary (the next token's logits depend on the last
# token only), so the target's exact distribution of the first and second emitted tokens after a
# fixed context is computable, and 20,000 requests run as one batch through the sampler (the twin;
# the kernel's tokens equal the twin's above).
# ---------------------------------------------------------------------------------------------

V, K, N = 6, 3, 20_000
CONTEXT_LAST = 2


def _tables():
    g = torch.Generator().manual_seed(11)
    target = torch.randn(V, V, generator=g) * 1.5
    draft = target + torch.randn(V, V, generator=g) * 1.2  # a decent but imperfect draft
    return target, draft


def _filtered_probs(logits, temperature, top_k, top_p):
    n = logits.shape[0]
    return probs_from_logits(logits, torch.full((n,), temperature), torch.full((n,), top_k),
                             torch.full((n,), top_p))


def _speculate(proposer, temperature, top_k, top_p):
    """First and second emitted token of N requests (seed i) after the context, by speculative steps."""
    target, draft = _tables()
    gen = torch.Generator().manual_seed(5)
    seeds = torch.arange(N, dtype=torch.int64) * 7919 + 13
    last = torch.full((N,), CONTEXT_LAST)
    pos = torch.full((N,), 17)
    emitted = [[] for _ in range(N)]
    todo = torch.arange(N)
    while len(todo):
        n = len(todo)
        cur = last[todo]
        drafts, qs = [], []
        for _ in range(K):
            if proposer == "draft_model":
                q = _filtered_probs(draft[cur], temperature, top_k, top_p)
                cur = torch.multinomial(q, 1, generator=gen)[:, 0]
                qs.append(q)
            else:  # n-gram stand-in: a fixed guess of the next token, no probabilities
                cur = (cur * 5 + 1) % V
            drafts.append(cur)
        drafts = torch.stack(drafts, 1)  # [n, K]
        ctx = torch.cat([last[todo, None], drafts], 1)  # the target's row j conditions on ctx[:, j]
        logits = target[ctx].reshape(n * (K + 1), V)
        # rows are request-major: request r's K + 1 rows consecutive; drafts flattened the same way
        draft_probs = torch.stack(qs, 1).reshape(n * K, V) if qs else None
        out = rejection_sample_ref(
            drafts.reshape(-1), torch.arange(1, n + 1) * K, draft_probs, logits,
            torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p),
            seeds[todo], pos[todo])
        lengths = (out >= 0).sum(1)
        for r, row, length in zip(todo.tolist(), out.tolist(), lengths.tolist(), strict=True):
            emitted[r].extend(row[:length])
        last[todo] = out[torch.arange(n), lengths - 1]
        pos[todo] += lengths
        todo = torch.tensor([r for r in todo.tolist() if len(emitted[r]) < 2], dtype=torch.long)
    toks = torch.tensor([e[:2] for e in emitted])
    return toks[:, 0], toks[:, 1]


def _exact(temperature, top_k, top_p):
    target, _ = _tables()
    step = _filtered_probs(target, temperature, top_k, top_p)  # [prev, next]
    first = step[CONTEXT_LAST]
    return first, first @ step


def _chi_square_p(samples, probs):
    """p-value of Pearson's chi-square goodness of fit (cells with zero probability must be empty)."""
    counts = torch.bincount(samples, minlength=V).double()
    expected = probs.double() * len(samples)
    assert counts[expected == 0].sum() == 0, "a token outside the target's support was emitted"
    keep = expected > 0
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


SETTINGS = [(1.0, -1, 1.0), (0.7, 4, 0.9)]


@pytest.mark.parametrize("proposer", ["draft_model", "ngram"])
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS, ids=["T1", "T0.7_topk4_topp0.9"])
def test_speculative_sampling_matches_the_target_distribution(proposer, temperature, top_k, top_p):
    first, second = _speculate(proposer, temperature, top_k, top_p)
    p1, p2 = _exact(temperature, top_k, top_p)
    assert _chi_square_p(first, p1) > 0.01
    assert _chi_square_p(second, p2) > 0.01


@pytest.mark.parametrize("proposer", ["draft_model", "ngram"])
def test_broken_sampler_fails_the_same_test(proposer, monkeypatch):
    """Resampling from p (instead of norm(max(0, p - q))) after a rejection over-weights the tokens the
    draft likes; the goodness-of-fit test must catch it."""
    monkeypatch.setattr(rs, "recovery_weights", lambda p, q: p)
    first, second = _speculate(proposer, 1.0, -1, 1.0)
    p1, p2 = _exact(1.0, -1, 1.0)
    assert min(_chi_square_p(first, p1), _chi_square_p(second, p2)) < 0.01

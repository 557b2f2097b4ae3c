"""Token sampling by the Gumbel-max trick with noise keyed by (request seed, position).

Owns how a row of logits becomes a token id: greedy at temperature 0, otherwise
``argmax(logits / T + Gumbel)`` over the top-k / top-p set. The noise for vocabulary entry j of a
row is a pure function of (seed, position, j) (a counter-based integer hash), so a request draws the
same tokens whatever batch it lands in, and the Triton kernel reproduces it bit for bit. Never
materialises per-request random generators.
"""

from __future__ import annotations

import torch

from minirunner.kernels._triton import tl, triton

_MASK32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """The 'lowbias32' integer hash on uint32 values held in int64 (wrapping multiply, low 32 bits)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


U_MAX = 1.0 - 2.0**-24  # the largest fp32 below 1


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform (0, 1) noise, fp32 [num_rows, vocab_size], a function of (seed, position, column) only.

    seeds: int64 [num_rows] (any 64-bit value); positions: int64 [num_rows].
    """
    seeds = seeds.long()
    key = hash32(seeds ^ hash32((seeds >> 32) ^ hash32(positions.long() + 0x9E3779B9)))
    cols = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = hash32(key[:, None] ^ hash32(cols[None, :] + 0x632BE5AB))
    # 24 high bits, centred; the top one rounds to 1.0 in fp32, so it is clamped below 1: never exactly
    # 0 or 1, so log(-log(u)) is finite (u = 1 made the Gumbel noise +inf: that token won whatever its
    # logit, even -inf from a mask)
    return (((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))).clamp(max=U_MAX)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p set with -inf.

    logits: fp32 [num_rows, vocab]; top_k: int64 [num_rows] (-1 or 0 = off); top_p: fp32
    [num_rows] (1.0 = off). The top-p set is the smallest prefix of the sorted distribution whose
    mass reaches top_p.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
    drop = ranks >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p = 1 is "off": without the guard, fp32 rounding of the cumsum can reach 1.0 early and
    # cut the far tail.
    drop = drop | ((mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0))
    drop[:, 0] = False  # the most likely token always stays
    return logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))


def sample_ref(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    apply_filters: bool | None = None,
) -> torch.Tensor:
    """Sample one token per row.

    logits: [num_rows, vocab] (any float dtype); temperatures: fp32 [num_rows] (0 = greedy);
    top_k: int64 [num_rows]; top_p: fp32 [num_rows]; seeds, positions: int64 [num_rows] (position
    of the token being sampled). apply_filters (keyword): False skips the top-k/top-p sort (the caller
    knows no row asks for it); True or None (the default) applies it (a no-op for rows with the
    filters off). Returns int64 [num_rows].
    """
    logits = logits.float()
    greedy = temperatures <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    scaled = logits / safe_t[:, None]
    if apply_filters is not False:
        scaled = apply_top_k_top_p(scaled, top_k, top_p)
    gumbel = -torch.log(-torch.log(uniform_noise(seeds, positions, logits.shape[-1])))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


# ---------------------------------------------------------------------------------------------
# Triton: one program per row streams the vocabulary in chunks, adds the same hash noise, and
# keeps a running argmax, so the softmax (and the noise matrix) is never materialised.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _hash32(x):
    """lowbias32 on uint32 (multiplies wrap mod 2**32; the casts pin that whatever the promotion)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D).to(tl.uint32)
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B).to(tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _sample_kernel(
    out_ptr, logits_ptr, scaled_ptr, temperatures_ptr, seeds_ptr, positions_ptr,
    vocab, stride_l, stride_s, PRESCALED: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(temperatures_ptr + row).to(tl.float32)
    greedy = t <= 0.0
    safe_t = tl.where(greedy, 1.0, t)
    seed = tl.load(seeds_ptr + row).to(tl.int64)
    pos = tl.load(positions_ptr + row).to(tl.int64)
    # key = hash32(seed ^ hash32((seed >> 32) ^ hash32(pos + 0x9E3779B9))), all on the low 32 bits.
    h = _hash32((pos.to(tl.uint32) + 0x9E3779B9).to(tl.uint32))
    h = _hash32((seed >> 32).to(tl.uint32) ^ h)
    key = _hash32(seed.to(tl.uint32) ^ h)

    offs = tl.arange(0, BLOCK_V)
    best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK_V], tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + offs
        m = cols < vocab
        x = tl.load(logits_ptr + row * stride_l + cols, mask=m, other=float("-inf")).to(tl.float32)
        if PRESCALED:
            s = tl.load(scaled_ptr + row * stride_s + cols, mask=m, other=float("-inf"))
        else:
            s = tl.math.div_rn(x, tl.zeros([BLOCK_V], tl.float32) + safe_t)
        bits = _hash32(key ^ _hash32((cols.to(tl.uint32) + 0x632BE5AB).to(tl.uint32)))
        u = tl.minimum(((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), 0.99999994)
        noisy = s + (-tl.log(-tl.log(u)))
        val = tl.where(greedy, x, noisy)
        val = tl.where(m, val, float("-inf"))
        better = val > best_v  # strict: each lane keeps its first maximum, as torch.argmax does
        best_v = tl.where(better, val, best_v)
        best_i = tl.where(better, cols, best_i)
    top = tl.max(best_v, axis=0)
    idx = tl.min(tl.where(best_v == top, best_i, 2147483647), axis=0)
    tl.store(out_ptr + row, idx.to(tl.int64))


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    apply_filters: bool | None = None,
) -> torch.Tensor:
    """Triton version of :func:`sample_ref`: same arguments, shapes, dtypes and tokens.

    Greedy, temperature and the Gumbel noise are fused into one pass over the vocabulary. Top-k /
    top-p need a sort, which does not fit a streaming kernel: when any row uses them, the masking
    runs first in torch (:func:`apply_top_k_top_p`, on the temperature-scaled logits, as the twin
    does) and the kernel reads the masked logits. apply_filters (keyword): True/False if the caller
    knows (no device sync); None checks the tensors (one sync).
    Tokens equal the twin's: the noise bits are identical; only a last-ulp difference between two
    libm ``log``s could flip a row whose two best scores tie to ~1e-7.
    """
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    num_rows, vocab = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    if apply_filters is None:
        apply_filters = bool((((top_k > 0) & (top_k < vocab)) | (top_p < 1.0)).any())
    scaled = logits
    if apply_filters:
        greedy = temperatures <= 0
        safe_t = torch.where(greedy, torch.ones_like(temperatures), temperatures)
        scaled = apply_top_k_top_p(logits.float() / safe_t[:, None], top_k, top_p)
    _sample_kernel[(num_rows,)](
        out, logits, scaled, temperatures, seeds, positions,
        vocab, logits.stride(0), scaled.stride(0),
        PRESCALED=apply_filters, BLOCK_V=min(4096, triton.next_power_of_2(vocab)),
    )
    return out

"""Token sampling by the Gumbel-max trick with noise keyed by (request seed, position).

Owns how a row of logits becomes a token id: greedy at temperature 0, otherwise
``argmax(logits / T + Gumbel)`` over the top-k / top-p set. The noise for vocabulary entry j of a row is
a pure function of (seed, position, j) (a counter-based integer hash), so a request draws the same tokens
whatever batch it lands in, and a Triton kernel can reproduce it exactly. Never materialises per-request
random generators.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """The 'lowbias32' integer hash on uint32 values held in int64 (wrapping multiply, low 32 bits kept)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform (0, 1) noise, fp32 [num_rows, vocab_size], a pure function of (seed, position, column).

    seeds: int64 [num_rows] (any 64-bit value); positions: int64 [num_rows].
    """
    seeds = seeds.long()
    key = hash32(seeds ^ hash32((seeds >> 32) ^ hash32(positions.long() + 0x9E3779B9)))
    cols = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = hash32(key[:, None] ^ hash32(cols[None, :] + 0x632BE5AB))
    # 24 high bits, centred: never exactly 0 or 1, so log(-log(u)) is finite.
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p set with -inf.

    logits: fp32 [num_rows, vocab]; top_k: int64 [num_rows] (-1 or 0 = off); top_p: fp32 [num_rows]
    (1.0 = off). The top-p set is the smallest prefix of the sorted distribution whose mass reaches top_p.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
    drop = ranks >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = drop | (mass_before >= top_p[:, None])
    drop[:, 0] = False  # the most likely token always stays
    return logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))


def sample_ref(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Sample one token per row.

    logits: [num_rows, vocab] (any float dtype); temperatures: fp32 [num_rows] (0 = greedy);
    top_k: int64 [num_rows]; top_p: fp32 [num_rows]; seeds, positions: int64 [num_rows] (position of the
    token being sampled). Returns int64 [num_rows].
    """
    logits = logits.float()
    greedy = temperatures <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    scaled = apply_top_k_top_p(logits / safe_t[:, None], top_k, top_p)
    gumbel = -torch.log(-torch.log(uniform_noise(seeds, positions, logits.shape[-1])))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)

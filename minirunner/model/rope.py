"""Rotary position embeddings (RoPE): the default schedule and Llama 3's frequency scaling.

Owns the inverse frequencies and applying the rotation to q and k at given positions.
"""

from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """fp32 [head_dim // 2]. ``scaling`` is {} (default) or Llama 3's parameters."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if not scaling:
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: dict):
        super().__init__()
        self.register_buffer("inv_freq", inverse_frequencies(head_dim, theta, scaling),
                             persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions: int64 [num_tokens] -> (cos, signed_sin), each [num_tokens, 1, head_dim] in
        ``dtype``. signed_sin is sin with its first half negated, ready for :func:`apply_rotary`."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        return torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((-sin, sin), dim=-1)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim], each first-half entry rotated with its second-half partner.

    The usual ``x * cos + rotate_half(x) * sin`` with rotate_half(x) = [-x2, x1]: rolling x by half gives
    [x2, x1], and the sign sits in signed_sin = [-sin, sin], so the product is the same, bit for bit."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin

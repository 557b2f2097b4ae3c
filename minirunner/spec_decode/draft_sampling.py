"""The draft model's sampler: one draft token per request from the draft's logits, with the request's
own temperature, top-k and top-p and noise independent of the target's.

Owns the draft's per-request sampling parameters on the device and the draw (device ops only: nothing is
read back), for the draft model's passes (spec_decode/draft_passes.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from minirunner.core.host_copy import to_device
from minirunner.kernels._triton import use_triton
from minirunner.kernels.rejection_sampling import probs_from_logits
from minirunner.kernels.sampling import sample, sample_ref
from minirunner.spec_decode.proposer import DraftInput

_SEED_MASK = (1 << 63) - 1
# The draft draws its tokens with noise keyed by (seed ^ salt, position): independent of the noise the
# target's rejection sampler uses at the same position, which losslessness needs.
_DRAFT_SALT = 0x2545F4914F6CDD1D


class DraftSampling(NamedTuple):
    """The draft sampler's per-request parameters on the device, and whether any row needs the
    top-k / top-p sort (decided on the host, so drawing reads nothing back)."""

    temperatures: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor  # salted: the draft's noise is independent of the target's
    apply_filters: bool


def draft_sampling_params(requests: list[DraftInput], device: torch.device, vocab: int) -> DraftSampling:
    """The draft sampler's parameters for these requests: their own, the seeds salted."""
    def put(values, dtype) -> torch.Tensor:  # staged, pinned copies
        return to_device(np.asarray(values, dtype=dtype), device)

    return DraftSampling(
        put([r.params.temperature for r in requests], np.float32),
        put([r.params.top_k for r in requests], np.int64),
        put([r.params.top_p for r in requests], np.float32),
        put([(r.seed ^ _DRAFT_SALT) & _SEED_MASK for r in requests], np.int64),
        any(0 < r.params.top_k < vocab or r.params.top_p < 1 for r in requests))


def draw_drafts(logits: torch.Tensor, params: DraftSampling, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft token per row from the draft's logits [rows, vocab], seeded by (salted seed, position
    of the token drawn): (tokens int64 [rows], q fp32 [rows, vocab], the distribution each was drawn
    from). Device ops only: nothing is read back."""
    sampler = sample if use_triton(logits.device) else sample_ref
    p = params
    tokens = sampler(logits, p.temperatures, p.top_k, p.top_p, p.seeds, positions,
                     apply_filters=p.apply_filters)
    return tokens, probs_from_logits(logits, p.temperatures, p.top_k, p.top_p)

"""Speculative decoding: configuration, proposers (draft model, n-gram lookup), the formulas, metrics.

The engine's ``Speculator`` chooses k before each step and records what the target accepted after it;
the worker proposes the drafts after sampling (worker/drafter.py: n-gram from the tokens read; a draft
model, a worker component over the target's block tables, rows and buffers, with
``draft_passes.DraftPasses`` after every step); verification itself is the rejection
sampler (``rejection_sampler.RejectionSampler``, over the kernels of
``minirunner.kernels.rejection_sampling``).
"""

from minirunner.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]

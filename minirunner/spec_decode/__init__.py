"""Speculative decoding: configuration, proposers (draft model, n-gram lookup), the formulas, metrics.

The engine asks a ``Speculator`` for draft tokens before each step and reports what the target accepted
after it; verification itself is the rejection sampler (``rejection_sampler.RejectionSampler``, over
the kernels of ``minirunner.kernels.rejection_sampling``).
"""

from minirunner.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]

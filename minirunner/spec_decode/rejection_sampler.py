"""The rejection sampler of speculative decoding (vLLM's ``RejectionSampler``): which drafts the target
accepts, and the token it emits after them.

Owns the one call into minirunner/kernels/rejection_sampling.py —
the Triton kernel or its torch twin, chosen once at
construction, or the greedy rule alone (one argmax) for a batch that does not sample — made by the eager
verify step (worker/sampler.py) and the graph verify step (worker/cudagraph.py) alike. Takes the target's
logits, the drafts and their q (None: one-hot, n-gram drafts) and each request's sampling parameters,
seed and position; returns the emitted runs on the device. It never computes logits, never proposes
drafts and never rolls back what was rejected (the engine does).
"""

from __future__ import annotations

import torch

from minirunner.kernels._triton import use_triton
from minirunner.kernels.rejection_sampling import (
    greedy_rejection_sample,
    rejection_sample,
    rejection_sample_ref,
)


class RejectionSampler:
    """``triton``: use the Triton kernel (None: where ``device`` is CUDA and Triton is installed; on a
    CPU it runs only under TRITON_INTERPRET=1), else its torch twin."""

    def __init__(self, device: torch.device, triton: bool | None = None):
        triton = use_triton(device) if triton is None else triton
        self.kernel = rejection_sample if triton else rejection_sample_ref

    def __call__(self, draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                 draft_probs: torch.Tensor | None, target_logits: torch.Tensor, temperatures: torch.Tensor,
                 top_k: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                 uniform_k: int | None = None, all_greedy: bool = False,
                 max_k: int | None = None) -> torch.Tensor:
        """The emitted run of each request: int64 [batch, max_k + 1] on the device, its accepted drafts
        then the target's own token (recovered after a rejection, a bonus token after all k), -1 after
        the run ends. Lossless: each token is distributed as plain sampling from the target draws it.

        draft_token_ids: int64 [D]; cu_num_draft_tokens: int [batch], cumulative (request i has k_i
        drafts, 0 allowed); draft_probs: fp32 [D, vocab] or None (one-hot q); target_logits: [D + batch,
        vocab], request i's k_i + 1 rows consecutive (its last known token, then its drafts);
        temperatures (0 = greedy), top_k, top_p, seeds: [batch]; positions: int64 [batch], each
        request's first sampled position. ``uniform_k``: every request has that many drafts (static
        shapes, nothing read back: the graph verify step). ``all_greedy``: every temperature is 0 (the
        caller knows it on the host), so the greedy rule's one argmax gives the same runs. ``max_k``: the
        most drafts of any request, known on the host (an eager step then reads nothing back)."""
        if all_greedy:
            return greedy_rejection_sample(draft_token_ids, cu_num_draft_tokens, target_logits, uniform_k,
                                           max_k)
        return self.kernel(draft_token_ids, cu_num_draft_tokens, draft_probs, target_logits, temperatures,
                           top_k, top_p, seeds, positions, uniform_k=uniform_k, max_k=max_k)


def emitted_runs(runs: torch.Tensor) -> list[list[int]]:
    """The runs on the host, each without its -1 tail (the step's one device-to-host copy)."""
    return [[t for t in row if t >= 0] for row in runs.tolist()]

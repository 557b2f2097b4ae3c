"""The verify stage of a speculative step: the target's logits over each request's last known token and
its drafts, through the rejection sampler, into the run of tokens each request emits.

Owns only the call to the rejection sampler (``kernels.rejection_sampling``) with the sampling requests'
parameters; the runner computes the logits and the engine rolls back what was rejected.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels._triton import HAS_TRITON
from kernels.rejection_sampling import rejection_sample, rejection_sample_ref


def verify_drafts(logits: torch.Tensor, inputs, draft_probs: torch.Tensor | None, temperature: np.ndarray,
                  top_k: np.ndarray, top_p: np.ndarray, seed: np.ndarray) -> list[list[int]]:
    """Each sampling request's emitted run: its accepted drafts, then the target's own token (a bonus
    token when every draft was accepted).

    logits: fp32 [num_drafts + num_sampling, vocab], for each sampling request its last known token's
    row then one row per draft (``inputs.logits_indices`` order); draft_probs: fp32 [num_drafts, vocab]
    or None for one-hot (n-gram) drafts. temperature, top_k, top_p, seed: [num_sampling] host arrays of
    the sampling requests' parameters; the positions come from ``inputs.sample_positions`` (the first
    sampled token's).
    """
    dev = logits.device
    cu = np.cumsum(inputs.num_drafts)
    if not temperature.any():
        return _greedy_runs(logits, inputs.draft_token_ids, inputs.num_drafts)
    sampler = rejection_sample if dev.type == "cuda" and HAS_TRITON else rejection_sample_ref
    def put(arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(arr).to(dev)

    out = sampler(put(inputs.draft_token_ids), put(cu), draft_probs, logits, put(temperature),
                  put(top_k), put(top_p), put(seed), inputs.sample_positions)
    return [[t for t in row if t >= 0] for row in out.tolist()]


def _greedy_runs(logits: torch.Tensor, drafts: np.ndarray, num_drafts: np.ndarray) -> list[list[int]]:
    """An all-greedy batch: the rejection sampler's greedy rule (accept while the draft is the target's
    argmax, then the argmax) on the host, from one argmax over the rows: no noise, no softmax."""
    best = logits.argmax(dim=-1).cpu().numpy()
    runs, row, d = [], 0, 0
    for k in num_drafts.tolist():
        run = []
        for j in range(k + 1):
            token = int(best[row + j])
            run.append(token)
            if j == k or drafts[d + j] != token:
                break
        runs.append(run)
        row, d = row + k + 1, d + k
    return runs

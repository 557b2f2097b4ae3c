"""The worker's side of structured output: each step's grammar bitmasks (data from the scheduler,
``SchedulerOutput.grammar_bitmask``, kept on the worker's request states for the step) applied to the
logits before sampling or verifying.

Owns expanding the packed bitmasks (int32, bit t of a row = token t allowed) to the rows of a step's
logits and setting the refused tokens to -inf, as ``xgrammar.apply_token_bitmask_inplace`` does, in plain
torch on any device: one staged copy in, no host sync. It never imports xgrammar and never samples.
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.core.host_copy import to_device


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [n, ceil(vocab / 32)] -> bool [n, vocab_size]: True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_grammar_bitmasks(logits: torch.Tensor, requests: list,
                           num_drafts: np.ndarray | None = None) -> torch.Tensor:
    """logits: fp32 [rows, vocab], ``1 + num_drafts[i]`` consecutive rows per request (one each when
    ``num_drafts`` is None); requests: the worker's request states in row order, each with its step's
    ``grammar_bitmask`` (int32 [its rows, words], or None: unconstrained). Returns the logits with every
    refused token at -inf (a new tensor), or ``logits`` itself when no request is constrained."""
    masks = [r.grammar_bitmask for r in requests]
    if all(m is None for m in masks):
        return logits
    counts = np.ones(len(requests), dtype=np.int64) if num_drafts is None else np.asarray(num_drafts) + 1
    words = -(-logits.shape[-1] // 32)
    packed = np.full((int(counts.sum()), words), -1, dtype=np.int32)
    start = 0
    for mask, count in zip(masks, counts.tolist(), strict=True):
        if mask is not None:
            if mask.shape != (count, words):
                raise RuntimeError(f"a grammar bitmask of shape {mask.shape} for {count} sampled rows of "
                                   f"{words} words: this is a bug, please report it")
            packed[start:start + count] = mask
        start += count
    allowed = unpack_bitmask(to_device(packed, logits.device), logits.shape[-1])
    return logits.masked_fill(~allowed, float("-inf"))

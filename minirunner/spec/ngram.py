"""N-gram prompt lookup: propose the tokens that followed the last n tokens the previous time they
appeared in the request's own prompt + output (no model, no probabilities: one-hot drafts).

Owns the lookup only; never touches the KV cache or the sampler.
"""

from __future__ import annotations

import numpy as np


def ngram_propose(token_ids: list[int] | np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k draft tokens for the sequence ``token_ids``.

    Tries n = max_n down to min_n: finds the most recent earlier occurrence of the last n tokens and
    returns (up to) the k tokens that followed it. Returns [] when nothing matches.
    """
    tokens = np.asarray(token_ids, dtype=np.int64)
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = tokens[L - n:]
        # windows starting at 0 .. L-n-1 (the suffix itself is excluded)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:L - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramProposer:
    """Prompt lookup for a batch of requests; drafts carry no probabilities (one-hot q)."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def release(self, live_ids: set[str]) -> None:
        """Nothing to free: the lookup keeps no state between steps."""

    def propose(self, requests, ks: list[int]) -> dict[str, tuple[list[int], None]]:
        out = {}
        for request, k in zip(requests, ks, strict=True):
            if k > 0:
                tokens = ngram_propose(request.all_token_ids, k, self.min_n, self.max_n)
                if tokens:
                    out[request.request_id] = (tokens, None)
        return out

"""N-gram prompt lookup: propose the tokens that followed the last n tokens the previous time they
appeared in the request's own prompt + output (no model, no probabilities: one-hot drafts).

Owns the lookup only; never touches the KV cache or the sampler.
"""

from __future__ import annotations

import numpy as np

from minirunner.spec_decode.proposer import Proposer


def ngram_propose(token_ids: list[int] | np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k draft tokens for the sequence ``token_ids``.

    Tries n = max_n down to min_n: finds the most recent earlier occurrence of the last n tokens and
    returns (up to) the k tokens that followed it. Returns [] when nothing matches.

    One pass over the sequence per call: the earlier positions holding the last token are the only
    places a match can end, and each of them is extended backwards at most max_n - 1 tokens (a step
    with no match costs as little as one with a match; the lookup runs every decode step).
    """
    tokens = np.asarray(token_ids, dtype=np.int64)
    L = len(tokens)
    if L < 2 or max_n < 1:
        return []
    ends = np.flatnonzero(tokens[:L - 1] == tokens[L - 1])  # a match's last token, before the suffix
    if not len(ends):
        return []
    # length[i]: how many tokens match backwards from ends[i] (capped at max_n and by the sequence start)
    length = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for j in range(1, min(max_n, L - 1)):  # a match ends at L - 2 at the latest
        alive &= ends >= j
        alive[alive] = tokens[ends[alive] - j] == tokens[L - 1 - j]
        length += alive
    for n in range(max_n, min_n - 1, -1):
        hits = ends[length >= n]
        if len(hits):
            start = int(hits[-1]) + 1
            return tokens[start:start + k].tolist()
    return []


class NgramProposer(Proposer):
    """Prompt lookup for a batch of requests; drafts carry no probabilities (one-hot q)."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def free(self, request_id: str) -> None:
        """Nothing to free: the lookup keeps no state between steps."""

    def propose(self, requests, ks: list[int]) -> dict[str, tuple[list[int], None]]:
        out = {}
        for request, k in zip(requests, ks, strict=True):
            if k > 0:
                tokens = ngram_propose(request.all_token_ids, k, self.min_n, self.max_n)
                if tokens:
                    out[request.request_id] = (tokens, None)
        return out

"""Log-probabilities for sampled and prompt tokens, in vLLM's output shape.

Owns computing, from the model's raw fp32 logits (vLLM's default ``logprobs_mode="raw_logprobs"``:
before logit_bias, penalties, temperature, min_p and top-k/top-p), each scored token's log-probability,
its rank in the vocabulary (1 = most likely) and the top-k alternatives; and turning them into
``{token_id: Logprob}`` dicts. Never changes what is sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Logprob:
    """vLLM's ``Logprob``: the log-probability, the rank (1-based) and the token's text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass(slots=True)
class TokenLogprobs:
    """Host copies for m scored tokens: token_ids, ranks int [m]; logprobs float [m]; top_ids,
    top_logprobs [m, k] (k may be 0)."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


def score_tokens(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> TokenLogprobs:
    """logits: fp32 [m, vocab] (raw); token_ids: int64 [m], the token scored in each row; k: how many
    top alternatives to return (0..vocab)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, token_ids[:, None].long())
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    k = min(k, logprobs.shape[-1])
    top_lp, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], token_ids[:, None][:, :0])
    return TokenLogprobs(token_ids.tolist(), chosen[:, 0].tolist(), ranks.tolist(), top_ids.tolist(),
                         top_lp.tolist())


def as_dicts(scored: TokenLogprobs, decode=None) -> list[dict[int, Logprob]]:
    """One ``{token_id: Logprob}`` per scored token: the token itself first, then its top-k (the
    token appears once if it is among them, so a dict holds k or k + 1 entries, as in vLLM)."""
    out = []
    for i, token in enumerate(scored.token_ids):
        d = {token: Logprob(scored.logprobs[i], scored.ranks[i],
                            decode(token) if decode else None)}
        for rank, (tid, lp) in enumerate(zip(scored.top_ids[i], scored.top_logprobs[i],
                                             strict=True), start=1):
            if tid not in d:
                d[tid] = Logprob(lp, rank, decode(tid) if decode else None)
        out.append(d)
    return out


def prompt_rows(scheduled) -> tuple[list[int], list[int], list[tuple[str, int, int, int]]]:
    """For requests that asked for prompt logprobs, which query rows of this step predict a prompt
    token. Row j of a request's query holds position start + j and predicts token start + j + 1.

    scheduled: per request in batch order, (request id, prompt ids, k or None, first position to score
    or None, start, query tokens); a preempted request recomputing its prompt scores nothing twice.
    Returns (hidden row indices, the prompt token each predicts, per request (request id, first
    predicted position, number of rows, k)).
    """
    rows, targets, spans = [], [], []
    offset = 0
    for rid, prompt, k, first, start, n in scheduled:
        if k is not None and first is not None:
            lo = max(start, first)
            hi = min(start + n, len(prompt) - 1)
            if hi > lo:
                rows += range(offset + lo - start, offset + hi - start)
                targets += [int(t) for t in prompt[lo + 1:hi + 1]]
                spans.append((rid, lo + 1, hi - lo, k))
        offset += n
    return rows, targets, spans


def _rows(scored: TokenLogprobs, lo: int, hi: int, k: int) -> TokenLogprobs:
    """Rows [lo, hi), keeping each row's first k alternatives (the runner scores the batch's
    largest k)."""
    return TokenLogprobs(scored.token_ids[lo:hi], scored.logprobs[lo:hi], scored.ranks[lo:hi],
                         [t[:k] for t in scored.top_ids[lo:hi]],
                         [t[:k] for t in scored.top_logprobs[lo:hi]])


def collect_step_logprobs(requests: dict, scheduled, prompt_scores: dict, sampled: TokenLogprobs | None,
                          decode) -> None:
    """Append one step's prompt logprobs (request id -> (first position, scores)) and sampled-token
    logprobs (one row per sampling request, in order) to the requests that asked for them. A request
    with ``detokenize=False`` gets ``decoded_token`` None, as in vLLM."""
    for rid, (first, scored) in prompt_scores.items():
        request = requests.get(rid)
        if request is None or request.is_finished:  # aborted since its step was launched
            continue
        assert first == len(request.prompt_logprobs), "prompt logprobs out of order"
        k = request.params.prompt_logprobs
        request.prompt_logprobs += as_dicts(_rows(scored, 0, len(scored.token_ids), k),
                                            decode if request.params.detokenize else None)
    if sampled is None:
        return
    for i, s in enumerate(s for s in scheduled if s.is_sampling):
        request = s.request
        if request.logprobs is None or request.is_finished:  # finished since the step was launched
            continue
        row = _rows(sampled, i, i + 1, request.params.logprobs)
        request.logprobs += as_dicts(row, decode if request.params.detokenize else None)
        request.cumulative_logprob += row.logprobs[0]


def score_prompts(logits_at, hidden: torch.Tensor, scheduled) -> dict[str, tuple[int, TokenLogprobs]]:
    """Prompt logprobs for the query rows of this step that predict a prompt token (raw logits).

    logits_at(hidden, rows): the fp32 logits of those rows (the runner's ``logits_at``);
    hidden: [num_tokens, hidden_size], the step's final hidden states (rows in scheduled order).
    Returns request id -> (first scored prompt position, its scores).
    """
    if not any(k is not None for _, _, k, *_ in scheduled):
        return {}
    rows, targets, spans = prompt_rows(scheduled)
    if not rows:
        return {}
    dev = hidden.device
    logits = logits_at(hidden, torch.tensor(rows, device=dev))
    scored = score_tokens(logits, torch.tensor(targets, device=dev), max(k for *_, k in spans))
    out, lo = {}, 0
    for rid, first, count, _k in spans:
        out[rid] = (first, _rows(scored, lo, lo + count, len(scored.top_ids[0])))
        lo += count
    return out

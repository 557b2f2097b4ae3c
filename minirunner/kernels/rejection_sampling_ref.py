"""Rejection sampling's torch twins and shared math: which draft tokens the target accepts, and the
token after (the Triton kernel is ``rejection_sampling.rejection_sample``).

Owns turning the target's logits over k+1 positions per request (and the draft's probabilities) into the
emitted run of each request: the accepted draft prefix, then one token the target chooses itself (the
recovered token after a rejection, or the bonus token when all k drafts pass). Lossless: every emitted
token is distributed exactly as plain sampling from the target would draw it (Leviathan et al. 2023).
Randomness is keyed by (request seed, position) with the same counter hash as ``kernels.sampling`` here, so
a request with no drafts samples exactly the token plain sampling gives, whatever its batch. Never decides
how many drafts to propose and never touches the KV cache.

Layout (vLLM's names): drafts of all requests are flattened, ``draft_token_ids [num_draft_tokens]``,
``cu_num_draft_tokens [batch]`` holds the cumulative end offset of each request's drafts; the target gives
``k_i + 1`` logits rows per request, request after request (``[num_draft_tokens + batch, vocab]``).
"""

from __future__ import annotations

import torch

from minirunner.kernels.sampling import apply_top_k_top_p, hash32, uniform_noise

# The acceptance uniform of a position hashes the row key with this constant instead of a column id, so
# it is independent of the Gumbel noise used for the recovered and bonus tokens at the same position.
_ACCEPT_SALT = 0x1B873593


def scaled_logits(logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor) -> torch.Tensor:
    """logits / T with top-k / top-p applied (-inf outside the set), exactly as plain sampling does.

    logits: [rows, vocab] any float; temperatures (0 = greedy), top_k, top_p: [rows]. Greedy rows keep
    their raw logits (their argmax is the greedy token). Returns fp32 [rows, vocab]."""
    logits = logits.float()
    greedy = temperatures <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    scaled = apply_top_k_top_p(logits / safe_t[:, None], top_k, top_p)
    return torch.where(greedy[:, None], logits, scaled)


def probs_from_logits(logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor) -> torch.Tensor:
    """The distribution plain sampling draws from: softmax(top-k/top-p(logits / T)), fp32 [rows, vocab].
    A draft model passes its own logits through this, so q is filtered the same way as p."""
    return torch.softmax(scaled_logits(logits, temperatures, top_k, top_p), dim=-1)


def accept_uniform(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Uniform (0, 1) fp32 [rows] for the accept test of the token at each position (seed, position)."""
    seeds = seeds.long()
    key = hash32(seeds ^ hash32((seeds >> 32) ^ hash32(positions.long() + 0x9E3779B9)))
    bits = hash32(key ^ _ACCEPT_SALT)
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


def one_hot_probs(token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """q of drafts drawn with certainty (n-gram lookup, greedy draft passes): fp32 [n, vocab], one-hot
    on each token; what ``draft_probs=None`` means to the rejection samplers."""
    return torch.nn.functional.one_hot(token_ids.long(), vocab).float()


def recovery_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalised distribution of the token emitted after a rejection: max(0, p - q). [rows, vocab]."""
    return (p - q).clamp_min(0.0)


def _request_index(cu_num_draft_tokens: torch.Tensor, num_draft_tokens: int,
                   uniform_k: int | None = None):
    """For each draft token: its request and its index j within that request's drafts; and each
    request's k. ``uniform_k``: every request has that many drafts, so the indices come from static
    shapes alone (no value is read back: the graph-mode verify step)."""
    cu = cu_num_draft_tokens.long()
    batch, dev = cu.shape[0], cu.device
    if uniform_k is not None:
        req = torch.arange(batch, device=dev).repeat_interleave(uniform_k)
        j = torch.arange(uniform_k, device=dev).repeat(batch)
        return req, j, torch.full((batch,), uniform_k, dtype=torch.long, device=dev)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    req = torch.repeat_interleave(torch.arange(batch, device=dev), cu - starts,
                                  output_size=num_draft_tokens)
    j = torch.arange(num_draft_tokens, device=dev) - starts[req]
    return req, j, cu - starts


def rejection_sample_ref(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    uniform_k: int | None = None,
    max_k: int | None = None,
) -> torch.Tensor:
    """The emitted tokens of each request, int64 [batch, max_k + 1], -1 after the run ends.

    draft_token_ids: int64 [D]; cu_num_draft_tokens: int [batch] (cumulative; request i has
    k_i = cu[i] - cu[i-1] drafts, 0 allowed); draft_probs: fp32 [D, vocab], the distribution each draft
    token was drawn from, or None for proposers without probabilities (n-gram: one-hot q);
    target_logits: [D + batch, vocab], request i's k_i + 1 rows consecutive; temperatures (0 = greedy),
    top_k, top_p, seeds: [batch]; positions: int64 [batch], the position of each request's first
    drafted token (row j of request i samples position positions[i] + j).

    Greedy rows accept while the draft equals the target's argmax, then emit the argmax. Sampling rows
    accept draft x with probability min(1, p(x)/q(x)); after a rejection they emit a token drawn from
    norm(max(0, p - q)); when all k_i pass, a bonus token drawn from p at the last row.

    ``uniform_k``: every request has exactly that many drafts (the uniform verify step): nothing is
    read back to the host and every shape is static, so the call compiles and captures. ``max_k``: the
    most drafts of any request, when the caller knows it on the host (an eager step: nothing is read
    back either); None: read from ``cu_num_draft_tokens``.
    """
    batch = cu_num_draft_tokens.shape[0]
    D = draft_token_ids.shape[0]
    dev = target_logits.device
    req, j, k = _request_index(cu_num_draft_tokens, D, uniform_k)
    # Target row of each draft token (request i's rows start at cu[i-1] + i) and each request's last row.
    draft_row = torch.arange(D, device=dev) + req
    bonus_row = cu_num_draft_tokens.long() + torch.arange(batch, device=dev)
    if uniform_k is not None:  # rows in order, k + 1 per request: no scatter needed
        row_req = torch.arange(batch, device=dev).repeat_interleave(uniform_k + 1)
        row_pos = (positions.long()[:, None] + torch.arange(uniform_k + 1, device=dev)).reshape(-1)
    else:
        row_req = torch.empty(D + batch, dtype=torch.long, device=dev)
        row_req[draft_row], row_req[bonus_row] = req, torch.arange(batch, device=dev)
        row_pos = torch.empty_like(row_req)
        row_pos[draft_row], row_pos[bonus_row] = positions.long()[req] + j, positions.long() + k

    scaled = scaled_logits(target_logits, temperatures[row_req], top_k[row_req], top_p[row_req])
    greedy_row = temperatures[row_req] <= 0
    noise = -torch.log(-torch.log(uniform_noise(seeds[row_req], row_pos, scaled.shape[-1])))
    # What plain sampling would emit at every row: argmax for greedy rows, Gumbel-max otherwise.
    plain = torch.where(greedy_row, scaled.argmax(-1), (scaled + noise).argmax(-1))

    p = torch.softmax(scaled[draft_row], dim=-1)
    if draft_probs is None:
        q = one_hot_probs(draft_token_ids, p.shape[-1])
    else:
        q = draft_probs.float()
    p_x = p.gather(1, draft_token_ids[:, None])[:, 0]
    q_x = q.gather(1, draft_token_ids[:, None])[:, 0]
    u = accept_uniform(seeds[req], row_pos[draft_row])
    greedy = greedy_row[draft_row]
    accepted = torch.where(greedy, draft_token_ids == plain[draft_row], (q_x > 0) & (p_x >= u * q_x))
    residual = recovery_weights(p, q)
    recovered = (torch.log(residual) + noise[draft_row]).argmax(-1)
    # p == q up to rounding leaves no residual mass: a rejection is then (almost) impossible, and
    # the target's own sample is the right fallback.
    recovered = torch.where(greedy | (residual.sum(-1) <= 0), plain[draft_row], recovered)

    if uniform_k is not None:
        return _uniform_runs(draft_token_ids, accepted, recovered, plain[bonus_row], uniform_k)
    return _ragged_runs(draft_token_ids, accepted, recovered, plain[bonus_row], req, j, k, max_k)


def greedy_rejection_sample(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    uniform_k: int | None = None,
    max_k: int | None = None,
) -> torch.Tensor:
    """What :func:`rejection_sample_ref` and :func:`rejection_sample` return when every temperature is 0,
    from one argmax over the rows (no noise, no softmax, no filters): accept while the draft is the
    target's argmax, then emit the argmax. Same arguments (those the greedy rule reads), shapes and
    tokens. Plain torch on every device: there is no sampling for a kernel to fuse."""
    batch = cu_num_draft_tokens.shape[0]
    D = draft_token_ids.shape[0]
    req, j, k = _request_index(cu_num_draft_tokens, D, uniform_k)
    best = target_logits.argmax(dim=-1)
    draft_row = torch.arange(D, device=best.device) + req
    bonus = best[cu_num_draft_tokens.long() + torch.arange(batch, device=best.device)]
    recovered = best[draft_row]
    accepted = draft_token_ids == recovered
    if uniform_k is not None:
        return _uniform_runs(draft_token_ids, accepted, recovered, bonus, uniform_k)
    return _ragged_runs(draft_token_ids, accepted, recovered, bonus, req, j, k, max_k)


def _ragged_runs(draft_token_ids: torch.Tensor, accepted: torch.Tensor, recovered: torch.Tensor,
                 bonus: torch.Tensor, req: torch.Tensor, j: torch.Tensor, k: torch.Tensor,
                 max_k: int | None = None) -> torch.Tensor:
    """The emitted runs [batch, max_k + 1], -1 after each ends, from each draft's verdict (``accepted``,
    bool [D]; ``recovered``, the token emitted if it is the first rejection, int64 [D]) and each
    request's ``bonus`` token (emitted after all its k drafts pass); req, j, k: ``_request_index``;
    ``max_k``: k's largest value when the host knows it (else read back: a sync on CUDA)."""
    batch, dev = bonus.shape[0], bonus.device
    if max_k is None:
        max_k = int(k.max()) if batch else 0
    out = torch.full((batch, max_k + 1), -1, dtype=torch.long, device=dev)
    acc = torch.zeros(batch, max_k + 1, dtype=torch.bool, device=dev)  # a False sentinel after k_i
    acc[req, j] = accepted
    num_accepted = acc.long().cumprod(dim=1).sum(dim=1)
    out[req, j] = torch.where(j < num_accepted[req], draft_token_ids, -1)
    rec = torch.full((batch, max_k + 1), 0, dtype=torch.long, device=dev)
    rec[req, j] = recovered
    final = torch.where(num_accepted < k, rec.gather(1, num_accepted[:, None])[:, 0], bonus)
    out[torch.arange(batch, device=dev), num_accepted] = final
    return out


def _uniform_runs(draft_token_ids: torch.Tensor, accepted: torch.Tensor, recovered: torch.Tensor,
                  bonus: torch.Tensor, k: int) -> torch.Tensor:
    """The emitted runs [batch, k + 1] when every request has k drafts, from elementwise ops alone
    (the same runs as :func:`_ragged_runs`; the compiled verify step uses this form: no in-place index
    writes for the compiler to reorder)."""
    batch = bonus.shape[0]
    num_accepted = accepted.view(batch, k).long().cumprod(dim=1).sum(dim=1)[:, None]
    cols = torch.arange(k + 1, device=bonus.device)[None, :]
    drafts = torch.cat((draft_token_ids.view(batch, k), bonus.new_full((batch, 1), -1)), dim=1)
    recovered = torch.cat((recovered.view(batch, k), bonus[:, None]), dim=1)
    # after a rejection at j = num_accepted the recovered token; after all k, the bonus token
    final = recovered.gather(1, num_accepted)
    return torch.where(cols < num_accepted, drafts, torch.where(cols == num_accepted, final, -1))

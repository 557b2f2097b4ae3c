"""Rejection sampling for speculative decoding, the Triton kernel: one program per request walks its k+1
target rows and emits the accepted draft prefix and the token after. Its torch twin and the shared math
(probabilities, the acceptance uniform) are in ``rejection_sampling_ref``, re-exported here so one import
gives a kernel and its twin.

Layout (vLLM's names): drafts of all requests are flattened, ``draft_token_ids [num_draft_tokens]``,
``cu_num_draft_tokens [batch]`` holds the cumulative end offset of each request's drafts; the target gives
``k_i + 1`` logits rows per request, request after request (``[num_draft_tokens + batch, vocab]``).
"""

from __future__ import annotations

import torch

from minirunner.kernels._triton import tl, triton
from minirunner.kernels.rejection_sampling_ref import (
    accept_uniform,
    greedy_rejection_sample,
    one_hot_probs,
    probs_from_logits,
    recovery_weights,
    rejection_sample_ref,
    scaled_logits,
)
from minirunner.kernels.sampling import _hash32

__all__ = ["accept_uniform", "greedy_rejection_sample", "one_hot_probs", "probs_from_logits",
           "recovery_weights", "rejection_sample", "rejection_sample_ref", "scaled_logits"]


# ---------------------------------------------------------------------------------------------
# Triton: one program per request walks its k+1 rows in order; per row it streams the vocabulary
# (online max / sum for p, running argmaxes for the plain and the recovered token), then decides.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _rejection_kernel(
    out_ptr, draft_ids_ptr, cu_ptr, draft_probs_ptr, scaled_ptr, temperatures_ptr, seeds_ptr,
    positions_ptr, vocab, stride_out, stride_q, stride_s,
    HAS_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    end = tl.load(cu_ptr + req).to(tl.int64)
    start = tl.where(req > 0, tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64), 0)
    n = end - start
    greedy = tl.load(temperatures_ptr + req).to(tl.float32) <= 0.0
    seed = tl.load(seeds_ptr + req).to(tl.int64)
    pos0 = tl.load(positions_ptr + req).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    done = n < 0  # False, as a scalar tensor the loop can carry
    for jj in range(0, n + 1):
        j = start * 0 + jj  # int64 in the compiler and in the interpreter (a plain int there)
        row = start + req + j
        is_bonus = j == n
        h = _hash32(((pos0 + j).to(tl.uint32) + 0x9E3779B9).to(tl.uint32))
        h = _hash32((seed >> 32).to(tl.uint32) ^ h)
        key = _hash32(seed.to(tl.uint32) ^ h)
        x = tl.load(draft_ids_ptr + start + j, mask=j < n, other=0).to(tl.int64)
        # pass 1: max and sum of exp for p; the plain token (greedy argmax or Gumbel-max); s at x
        m = tl.full([BLOCK_V], float("-inf"), tl.float32)
        z = tl.zeros([BLOCK_V], tl.float32)
        best_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        best_i = tl.zeros([BLOCK_V], tl.int32)
        s_x = tl.full([BLOCK_V], float("-inf"), tl.float32)
        for v0 in range(0, vocab, BLOCK_V):
            cols = v0 + offs
            valid = cols < vocab
            s = tl.load(scaled_ptr + row * stride_s + cols, mask=valid, other=float("-inf"))
            m_new = tl.maximum(m, s)
            z = z * tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new)) \
                + tl.where(s == float("-inf"), 0.0, tl.exp(s - m_new))
            m = m_new
            bits = _hash32(key ^ _hash32((cols.to(tl.uint32) + 0x632BE5AB).to(tl.uint32)))
            u = tl.minimum(((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), 0.99999994)
            val = tl.where(greedy, s, s + (-tl.log(-tl.log(u))))
            val = tl.where(valid, val, float("-inf"))
            better = val > best_v
            best_v = tl.where(better, val, best_v)
            best_i = tl.where(better, cols, best_i)
            s_x = tl.where(cols == x, s, s_x)
        m_all = tl.max(m, axis=0)
        z_all = tl.sum(tl.where(m == float("-inf"), 0.0, z * tl.exp(m - m_all)), axis=0)
        top = tl.max(best_v, axis=0)
        plain = tl.min(tl.where(best_v == top, best_i, 2147483647), axis=0).to(tl.int64)
        p_x = tl.exp(tl.max(s_x, axis=0) - m_all) / z_all
        if HAS_DRAFT_PROBS:
            q_x = tl.load(draft_probs_ptr + (start + j) * stride_q + x, mask=j < n, other=0.0)
        else:
            q_x = 1.0
        abits = _hash32(key ^ 0x1B873593)
        ua = ((abits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        accepted = tl.where(greedy, x == plain, (q_x > 0) & (p_x >= ua * q_x)) & (j < n)
        # pass 2 (only meaningful after a rejection): Gumbel-max over log(max(0, p - q))
        rbest_v = tl.full([BLOCK_V], float("-inf"), tl.float32)
        rbest_i = tl.zeros([BLOCK_V], tl.int32)
        mass = tl.zeros([BLOCK_V], tl.float32)
        for v0 in range(0, vocab, BLOCK_V):
            cols = v0 + offs
            valid = cols < vocab
            s = tl.load(scaled_ptr + row * stride_s + cols, mask=valid, other=float("-inf"))
            p = tl.exp(s - m_all) / z_all
            if HAS_DRAFT_PROBS:
                q_cols = tl.where(j < n, vocab, 0)  # the bonus row has no draft distribution
                q = tl.load(draft_probs_ptr + (start + j) * stride_q + cols, mask=cols < q_cols,
                            other=0.0)
            else:
                q = tl.where(cols == x, 1.0, 0.0)
            r = tl.where(valid, tl.maximum(p - q, 0.0), 0.0)
            mass += r
            bits = _hash32(key ^ _hash32((cols.to(tl.uint32) + 0x632BE5AB).to(tl.uint32)))
            u = tl.minimum(((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), 0.99999994)
            val = tl.where(r > 0, tl.log(r) + (-tl.log(-tl.log(u))), float("-inf"))
            better = val > rbest_v
            rbest_v = tl.where(better, val, rbest_v)
            rbest_i = tl.where(better, cols, rbest_i)
        rtop = tl.max(rbest_v, axis=0)
        recovered = tl.min(tl.where(rbest_v == rtop, rbest_i, 2147483647), axis=0).to(tl.int64)
        recovered = tl.where(greedy | (tl.sum(mass, axis=0) <= 0), plain, recovered)
        token = tl.where(is_bonus, plain, tl.where(accepted, x, recovered))
        tl.store(out_ptr + req * stride_out + j, token, mask=~done)
        done = done | ~accepted


def rejection_sample(
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
    """Triton version of :func:`rejection_sample_ref`: same arguments, shapes, dtypes and tokens.

    Temperature and top-k / top-p masking (a sort) run first in torch (:func:`scaled_logits`, shared
    with the twin); the kernel does the per-request accept/reject walk in one program. Without
    ``uniform_k`` or ``max_k`` it reads ``cu_num_draft_tokens`` on the host once to size the output; with
    ``uniform_k`` (the uniform verify step of a CUDA graph) nothing is read back and the launch captures,
    with ``max_k`` (an eager step whose caller knows it) nothing is read back.
    """
    batch = cu_num_draft_tokens.shape[0]
    cu = cu_num_draft_tokens.long()
    k = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    if uniform_k is not None:
        max_k = uniform_k
    elif max_k is None:
        max_k = int(k.max()) if batch else 0
    out = torch.full((batch, max_k + 1), -1, dtype=torch.long, device=target_logits.device)
    if batch == 0:
        return out
    row_req = torch.repeat_interleave(torch.arange(batch, device=cu.device), k + 1,
                                      output_size=draft_token_ids.shape[0] + batch)
    scaled = scaled_logits(target_logits, temperatures[row_req], top_k[row_req], top_p[row_req])
    scaled = scaled.contiguous()
    dp = draft_probs.float().contiguous() if draft_probs is not None else scaled
    vocab = scaled.shape[-1]
    _rejection_kernel[(batch,)](
        out, draft_token_ids.long().contiguous(), cu.contiguous(), dp, scaled,
        temperatures.float().contiguous(), seeds.long().contiguous(), positions.long().contiguous(),
        vocab, out.stride(0), dp.stride(0), scaled.stride(0),
        HAS_DRAFT_PROBS=draft_probs is not None, BLOCK_V=min(4096, triton.next_power_of_2(vocab)),
    )
    return out

"""Logits processors applied before the sampler: allowed_token_ids, bad_words, logit_bias, min_tokens,
the three penalties and min_p.

Owns the per-request penalty state on the device (a row per live request: output-token counts and a
prompt-token mask) and the batched ops that turn the model's fp32 logits into the logits the sampler
draws from, in vLLM's order: allowed_token_ids and bad_words (masks), logit_bias and min_tokens,
then repetition / frequency / presence penalties, then (in the sampler's temperature scale)
min_p. ``apply_logits_processors`` is pure tensor work on
dense ``[n, vocab]`` inputs — no host sync, no data-dependent shapes. The sampler applies it after the
forward, to the rows that ask (worker/sampler.py). It never samples and never touches the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minirunner.core.host_copy import to_device

_NEG_INF = float("-inf")


@dataclass(slots=True)
class LogitsBatch:
    """Per-step inputs of ``apply_logits_processors`` for n sampling rows (all on the logits' device).

    bias: fp32 [n, vocab] added to the logits (logit_bias; -inf where min_tokens holds EOS / stop ids
    off, outside allowed_token_ids, and on the last token of a bad word the output could complete), or
    None. counts: int32 [n, vocab] output-token counts and prompt_mask: bool [n, vocab]
    prompt tokens, or None when no row has a penalty. repetition / frequency / presence: fp32 [n]
    (1, 0, 0 = off). min_p, temperature: fp32 [n] (min_p 0 = off), or None when no row uses min_p.
    """

    bias: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    repetition: torch.Tensor | None = None
    frequency: torch.Tensor | None = None
    presence: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    temperature: torch.Tensor | None = None


def apply_logits_processors(logits: torch.Tensor, batch: LogitsBatch | None) -> torch.Tensor:
    """logits: fp32 [n, vocab] -> processed fp32 [n, vocab] (a new tensor; the input is untouched)."""
    if batch is None:
        return logits
    if batch.bias is not None:
        logits = logits + batch.bias
    if batch.counts is not None:
        output_mask = batch.counts > 0
        seen = batch.prompt_mask | output_mask
        # The CTRL rule (Keskar et al. 2019) as transformers and vLLM apply it: divide a positive
        # logit, multiply a negative one, for every token already in the prompt or the output.
        rep = batch.repetition[:, None]
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
        # OpenAI's frequency / presence penalties count output tokens only.
        logits = logits - batch.frequency[:, None] * batch.counts.to(logits.dtype)
        logits = logits - batch.presence[:, None] * output_mask.to(logits.dtype)
    if batch.min_p is not None:
        # min_p keeps tokens with p_T(x) >= min_p * max p_T, where p_T = softmax(logits / T). In logit
        # space that is logit >= max + T * log(min_p): the same set, without dividing first.
        top = logits.max(dim=-1, keepdim=True).values
        t = batch.temperature[:, None]
        active = (batch.min_p[:, None] > 0) & (t > 0)
        threshold = top + t * torch.log(batch.min_p.clamp_min(1e-30))[:, None]
        logits = torch.where(active & (logits < threshold), _NEG_INF, logits)
    return logits


class PenaltyState:
    """Rows of output-token counts and prompt masks for requests that use a penalty, on the device.

    A request gets a row the first time it samples with a penalty (built from all its tokens so far,
    so preemption and forking need nothing special) and keeps it until ``release``.
    """

    def __init__(self, vocab_size: int, device: torch.device, capacity: int = 8):
        self.vocab_size = vocab_size
        self.device = device
        self.counts = torch.zeros(capacity, vocab_size, dtype=torch.int32, device=device)
        self.prompt_mask = torch.zeros(capacity, vocab_size, dtype=torch.bool, device=device)
        self.rows: dict[str, int] = {}
        self._free = list(range(capacity - 1, -1, -1))

    def _grow(self) -> None:
        old = self.counts.shape[0]
        self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
        self.prompt_mask = torch.cat([self.prompt_mask, torch.zeros_like(self.prompt_mask)])
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def row(self, request) -> int:
        rid = request.req_id
        if rid in self.rows:
            return self.rows[rid]
        if not self._free:
            self._grow()
        r = self._free.pop()
        self.rows[rid] = r
        dev = self.device
        # index_fill_ / index_add_, not a scalar setitem or bincount: on CUDA those wait for the device
        self.prompt_mask[r].zero_()
        self.prompt_mask[r].index_fill_(0, _put(request.prompt_token_ids, np.int64, dev), True)
        out = _put(request.output_token_ids, np.int64, dev)
        self.counts[r].zero_()
        self.counts[r].index_add_(0, out, torch.ones(out.shape, dtype=torch.int32, device=dev))
        return r

    def record(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """rows, tokens: int64 [m] on the device: one more occurrence of each sampled token."""
        self.counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.int32),
                               accumulate=True)

    def release(self, request_id: str) -> None:
        r = self.rows.pop(request_id, None)
        if r is not None:
            self._free.append(r)


def needs_logits_processing(request) -> bool:
    """Whether the request's next token needs host-side state: this module's (see
    ``needs_logits_processors``) or a grammar's bitmask (structured output: the host's matcher must
    see the last token first)."""
    return needs_logits_processors(request) or request.params.structured_outputs is not None


def needs_logits_processors(request) -> bool:
    """Whether the plain sampler must apply this module's processors to the request's next token: logit
    bias, min_tokens suppression still pending, allowed_token_ids, bad words, repetition / presence /
    frequency penalties or min_p (the rejection sampler applies none of them)."""
    p = request.params
    return bool(p.logit_bias or p.has_penalties or p.min_p > 0 or p.allowed_token_ids is not None
                or p.bad_words_token_ids or len(request.output_token_ids) < p.min_tokens)


def needs_host_tokens(request) -> bool:
    """Whether the request's next token needs its last sampled token on the host first: bad words
    (their values), a pending min_tokens (their count) or a grammar (its matcher). Penalty counts are
    kept on the device, and bias, allowed ids and min_p read no tokens, so those may be scheduled with
    a step in flight."""
    p = request.params
    return bool(p.bad_words_token_ids or len(request.output_token_ids) < p.min_tokens
                or p.structured_outputs is not None)


def banned_bad_word_tokens(bad_words_token_ids: list[list[int]], output_token_ids) -> list[int]:
    """vLLM's bad-words rule: a word's last token is banned when the output so far ends with the rest
    of the word (a one-token word is always banned). Only output tokens count, not the prompt."""
    banned = []
    n = len(output_token_ids)
    for word in bad_words_token_ids:
        prefix = len(word) - 1
        if prefix > n:
            continue
        if prefix == 0 or list(output_token_ids[n - prefix:]) == word[:prefix]:
            banned.append(word[-1])
    return banned


class LogitsProcessors:
    """Builds each step's ``LogitsBatch`` from the requests' SamplingParams and keeps PenaltyState."""

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self.penalties = PenaltyState(vocab_size, device)
        self._penalty_rows: torch.Tensor | None = None
        self._penalty_index: torch.Tensor | None = None

    def prepare(self, requests: list) -> LogitsBatch | None:
        """requests: the sampling rows' worker states (worker/states.py), in row order. None when
        nothing applies."""
        self._penalty_rows = self._penalty_index = None
        params = [r.params for r in requests]
        use_bias = any(p.logit_bias or p.allowed_token_ids is not None or p.bad_words_token_ids
                       for p in params)
        suppress = [i for i, r in enumerate(requests)
                    if len(r.output_token_ids) < r.params.min_tokens]
        use_pen = any(p.has_penalties for p in params)
        use_min_p = any(p.min_p > 0 for p in params)
        if not (use_bias or suppress or use_pen or use_min_p):
            return None
        n, dev = len(requests), self.device
        batch = LogitsBatch()
        if use_bias or suppress:
            batch.bias = self._bias(requests, suppress)
        if use_pen:
            index = [i for i, p in enumerate(params) if p.has_penalties]
            state_rows = [self.penalties.row(requests[i]) for i in index]
            rows_t = _put(state_rows, np.int64, dev)
            index_t = _put(index, np.int64, dev)
            counts = torch.zeros(n, self.vocab_size, dtype=torch.int32, device=dev)
            prompt_mask = torch.zeros(n, self.vocab_size, dtype=torch.bool, device=dev)
            counts[index_t] = self.penalties.counts[rows_t]
            prompt_mask[index_t] = self.penalties.prompt_mask[rows_t]
            batch.counts, batch.prompt_mask = counts, prompt_mask
            batch.repetition = _put([p.repetition_penalty for p in params], np.float32, dev)
            batch.frequency = _put([p.frequency_penalty for p in params], np.float32, dev)
            batch.presence = _put([p.presence_penalty for p in params], np.float32, dev)
            self._penalty_rows, self._penalty_index = rows_t, index_t
        if use_min_p:
            batch.min_p = _put([p.min_p for p in params], np.float32, dev)
            batch.temperature = _put([p.temperature for p in params], np.float32, dev)
        return batch

    def _bias(self, requests: list, suppress: list[int]) -> torch.Tensor:
        """fp32 [n, vocab] on the device: logit_bias, then -inf for min_tokens' held-off ids, bad words'
        last tokens and every token outside allowed_token_ids. The host sends (row, token) pairs only,
        through staged copies; the scatters run on the device."""
        dev, vocab = self.device, self.vocab_size
        bias = torch.zeros(len(requests), vocab, dtype=torch.float32, device=dev)
        rows, cols, vals = [], [], []
        for i, r in enumerate(requests):
            for token, value in (r.params.logit_bias or {}).items():
                rows.append(i)
                cols.append(token)
                vals.append(value)
        if rows:
            bias.index_put_((_put(rows, np.int64, dev), _put(cols, np.int64, dev)),
                            _put(vals, np.float32, dev))
        rows, cols = [], []
        for i in suppress:  # min_tokens: EOS and stop ids may not end the output yet
            ids = [t for t in set(requests[i].eos_token_ids) | set(requests[i].params.stop_token_ids)
                   if t < vocab]
            rows += [i] * len(ids)
            cols += ids
        for i, r in enumerate(requests):
            if r.params.bad_words_token_ids:
                ids = banned_bad_word_tokens(r.params.bad_words_token_ids, r.output_token_ids)
                rows += [i] * len(ids)
                cols += ids
        if rows:
            bias.index_put_((_put(rows, np.int64, dev), _put(cols, np.int64, dev)),
                            torch.full((len(rows),), _NEG_INF, device=dev))
        allowed = [i for i, r in enumerate(requests) if r.params.allowed_token_ids is not None]
        if allowed:  # every other token is masked off
            keep = torch.zeros(len(requests), vocab, dtype=torch.bool, device=dev)
            rows = [i for i in allowed for _ in requests[i].params.allowed_token_ids]
            cols = [t for i in allowed for t in requests[i].params.allowed_token_ids]
            keep[_put(rows, np.int64, dev), _put(cols, np.int64, dev)] = True
            index = _put(allowed, np.int64, dev)
            bias[index] = bias[index].masked_fill(~keep[index], _NEG_INF)
        return bias

    def record(self, tokens: torch.Tensor) -> None:
        """tokens: int64 [n] sampled this step (device): update the penalty rows prepared for it."""
        if self._penalty_rows is not None:
            self.penalties.record(self._penalty_rows, tokens[self._penalty_index])

    def release(self, request_id: str) -> None:
        self.penalties.release(request_id)


def _put(values: list, dtype, device: torch.device) -> torch.Tensor:
    """A host list on the device through a staged, pinned copy (worker/buffers.py)."""
    return to_device(np.asarray(values, dtype=dtype), device)

"""StructuredOutputManager: the host side of structured output — one xgrammar matcher per request, each
step's token bitmasks, and the tokens the matchers accept once a step is read.

Owns the matchers (created when a request first samples, from its output so far, so a fork, a preemption
or a resumed request needs nothing special; dropped when the request is freed) and the bitmasks of a step:
for a request that samples, one row per position the step samples at — its next token, and after each of
k speculative drafts. The matcher is advanced through the drafts the grammar allows to fill those rows and
rolled back at once: only tokens the step emits, read back, ever advance it (``accept``), so a rejected
draft never does. Rows after a draft the grammar refuses stay all-allowed: the mask at that draft's own
position already rejects it, so they are never sampled from. It never touches a device tensor.
"""

from __future__ import annotations

import logging

import numpy as np

from minirunner.structured_output.compiler import GrammarCompiler, import_xgrammar

logger = logging.getLogger(__name__)


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids):
        """For one model: its tokenizer (None: structured output is refused), the width of its logits
        and its EOS ids (a completed grammar allows them)."""
        self.compiler = compiler = GrammarCompiler(tokenizer, vocab_size, stop_token_ids)
        self.vocab_size = compiler.vocab_size
        self.num_words = -(-compiler.vocab_size // 32)  # bitmask width: 32 tokens per int32
        self._matchers: dict[str, object] = {}

    def compile(self, params) -> None:
        """Check (and cache) the grammar of a request's StructuredOutputsParams; raises ValueError."""
        self.compiler.compile(params)

    def bitmasks(self, scheduled) -> dict[str, np.ndarray]:
        """``scheduled``: a step's ScheduledRequests. For each structured request that samples: int32
        [1 + drafts, ceil(vocab / 32)], bit t of row i set when token t is allowed at its i-th sampled
        position. Empty when no request of the step is structured."""
        masks = {}
        for s in scheduled:
            request = s.request
            if s.is_sampling and request.params.structured_outputs is not None and not request.is_finished:
                masks[request.request_id] = self._masks(request, s.draft_token_ids)
        return masks

    def _matcher(self, request):
        matcher = self._matchers.get(request.request_id)
        if matcher is None:
            xgr = import_xgrammar()
            matcher = xgr.GrammarMatcher(self.compiler.compile(request.params.structured_outputs))
            for token in request.output_token_ids:
                if not matcher.accept_token(int(token)):
                    break
            self._matchers[request.request_id] = matcher
        return matcher

    def _masks(self, request, drafts: list[int]) -> np.ndarray:
        import torch

        matcher = self._matcher(request)
        n = 1 + len(drafts)
        mask = torch.full((n, self.num_words), -1, dtype=torch.int32)
        advanced = 0
        for i in range(n):
            if matcher.is_terminated():  # the grammar ended (EOS accepted): nothing left to constrain
                break
            matcher.fill_next_token_bitmask(mask, i)
            if i == n - 1:
                break
            draft = int(drafts[i])
            if not 0 <= draft < self.vocab_size or not matcher.accept_token(draft):
                break
            advanced += 1
        if advanced:
            matcher.rollback(advanced)
        return mask.numpy()

    def accept(self, produced) -> None:
        """A step was read: ``produced`` is (request, tokens appended) per request. Each structured
        request's matcher accepts its new tokens."""
        for request, tokens in produced:
            matcher = self._matchers.get(request.request_id)
            if matcher is None:
                continue
            for token in tokens:
                if matcher.is_terminated():
                    break
                if not matcher.accept_token(int(token)):
                    logger.error("request %s: token %d is outside its grammar; its output may not match "
                                 "(this is a bug: please report it)", request.request_id, token)
                    break

    def free(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

"""DraftModelProposer: k draft tokens per request from a small model with its own paged KV cache.

Owns the draft model, its KV cache (its own BlockPool and KVCacheManager, without prefix caching) and a
second ModelRunner over it, plus one shadow sequence per request: the tokens the draft has seen and how
many of them have K/V in the draft cache. Why its own pool rather than the target's block tables: the
draft has other layer/head shapes and, above all, its own progress (it lags the target by one token and
runs ahead of it by k - 1 drafts), so separate tables let each cache roll back on its own and never tie
the target's prefix cache to a model that did not compute those blocks. Never verifies anything.

Rollback is by agreement: before proposing, a shadow sequence keeps K/V only for the prefix on which
its tokens agree with the request's verified tokens; rejected drafts' blocks return to the draft pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minirunner.attention import make_backend
from minirunner.config import EngineConfig, ModelConfig
from minirunner.core.host_copy import to_device
from minirunner.engine.scheduler import ScheduledRequest
from minirunner.engine.sequence import RunnableSequence
from minirunner.engine.step_data import WorkerRowsSent
from minirunner.kernels.rejection_sampling import one_hot_probs
from minirunner.kv.manager import KVCacheManager
from minirunner.model.loader import load_model
from minirunner.sampling_params import SamplingParams
from minirunner.spec_decode.draft_passes import DraftPasses
from minirunner.spec_decode.draft_sampling import draft_sampling_params, draw_drafts
from minirunner.spec_decode.proposer import DraftInput, Proposer
from minirunner.worker.model_runner import ModelRunner


@dataclass(eq=False)
class DraftSequence(RunnableSequence):
    """The draft model's shadow of one request (engine/sequence.py's protocol, for the draft's KV manager
    and runner): its tokens and their K/V progress in the draft cache. Its rows in the draft runner are
    greedy (``params``): the draft draws sampled drafts itself, from the logits, with its own noise."""

    request_id: str
    tokens: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_verified: int = 0  # tokens[:num_verified] were the request's verified tokens at the last call
    num_output_placeholders: int = 0  # the draft's passes are read at once: never any in flight
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    seed: int = 0
    eos_token_ids: frozenset[int] = frozenset()
    max_len: int = 0  # the draft's rows propose nothing: no cap to send

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.tokens  # the draft's rows see every token as prompt: it has no logits processors

    @property
    def all_token_ids(self) -> list[int]:
        return self.tokens

    @property
    def token_buffer(self) -> np.ndarray:
        return np.asarray(self.tokens, dtype=np.int64)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def output_token_ids(self) -> tuple[()]:
        return ()  # no min_tokens to enforce: the draft's decode passes may replay a graph step


class DraftModelProposer(Proposer):
    def __init__(self, draft_dir: str, config: EngineConfig, num_blocks: int):
        self.model_config = mc = ModelConfig.from_dir(draft_dir)
        self.model = load_model(draft_dir, mc, config.dtype, config.device)
        backend = make_backend(config, mc)
        self.kv = KVCacheManager(num_blocks, config.block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(self.model, backend, num_blocks, config.block_size,
                                  config.max_num_seqs, config.max_num_batched_tokens,
                                  config.max_model_len)
        if config.graph_mode != "none":  # the draft's one-token passes replay as the target's do
            from minirunner.worker.cudagraph import capture_sizes

            # the first draft pass after a verify replay feeds 2 tokens a row (spec_decode/draft_passes.py)
            self.runner.enable_graphs(config.graph_mode,
                                      capture_sizes(config.max_num_seqs, config.cudagraph_capture_sizes),
                                      extra_query_lens=(2,))
        self.max_batched = config.max_num_batched_tokens
        self.device = config.device
        self.seqs: dict[str, DraftSequence] = {}
        self.sent = WorkerRowsSent()  # what the draft runner's rows hold
        self.device_passes = DraftPasses(self) if self.runner.graphs is not None else None

    # -- bookkeeping ----------------------------------------------------------------------------
    def free(self, request_id: str) -> None:
        """Free one request's draft state: its shadow sequence, draft blocks and draft state row (the
        engine calls it when the request finishes or is aborted)."""
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.kv.free(seq)
            self.sent.forget(request_id)
            self.runner.state.release(request_id)

    def set_computed(self, request_id: str, num_computed_tokens: int) -> None:
        """The draft cache holds K/V for the first ``num_computed_tokens`` of the request's shadow
        sequence (the proposer schedules the draft runner, so it alone writes the shadow's count)."""
        self.seqs[request_id].num_computed_tokens = num_computed_tokens

    def _sync(self, request: DraftInput) -> DraftSequence:
        """Align the shadow sequence with the request's verified tokens, rolling back K/V past the
        first disagreement (rejected drafts) and returning emptied blocks to the pool."""
        seq = self.seqs.setdefault(request.request_id, DraftSequence(request.request_id))
        verified = np.asarray(request.all_token_ids).tolist()
        agree = seq.num_verified
        limit = min(len(seq.tokens), len(verified))
        while agree < limit and seq.tokens[agree] == verified[agree]:
            agree += 1
        # The last verified token is always fed again: its logits give the first draft. (Its K/V can
        # already be in the cache when a step's drafts were never verified, e.g. after preemption.)
        seq.num_computed_tokens = min(seq.num_computed_tokens, agree, len(verified) - 1)
        seq.tokens = list(verified)
        seq.num_verified = len(verified)
        self.kv.trim(seq)
        return seq

    # -- proposing ------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, requests: list[DraftInput], ks: list[int]):
        """Draft ks[i] tokens for requests[i] (each decode-ready). Returns {request_id: (tokens, q)}
        with q fp32 [len(tokens), vocab], the distribution each token was drawn from; a request the
        draft pool cannot hold gets no drafts this step."""
        seqs = {r.request_id: self._sync(r) for r in requests}
        want = {r.request_id: k for r, k in zip(requests, ks, strict=True) if k > 0}
        by_id = {r.request_id: r for r in requests}
        out: dict[str, tuple[list[int], list[torch.Tensor]]] = {rid: ([], []) for rid in want}
        # Pass 0 catches each draft up on its verified tokens (chunked under the token budget) and
        # samples its first draft; passes 1..k-1 feed one draft each and sample the next.
        pending = list(want)
        while pending:
            pending = self._forward(pending, seqs, by_id, out, catch_up=True)
        for j in range(1, max(want.values(), default=0)):
            active = [rid for rid in want if want[rid] > j and rid in out]
            for rid in self._forward(active, seqs, by_id, out, catch_up=False):
                want[rid] = j  # the draft pool ran dry: keep the drafts made so far
        return {rid: (toks, _stack_probs(toks, qs, self.model_config.vocab_size))
                for rid, (toks, qs) in out.items() if toks}

    def _forward(self, rids, seqs, by_id, out, catch_up: bool) -> list[str]:
        """One draft forward over ``rids``. Catching up: returns the ids with verified tokens left
        (the token budget ran out); a request the pool cannot hold loses its drafts and its draft K/V.
        Decoding: returns the ids the pool could not extend."""
        budget, scheduled, left = self.max_batched, [], []
        for rid in rids:
            seq = seqs[rid]
            todo = seq.num_tokens - seq.num_computed_tokens
            n = min(todo, budget)
            if n == 0:
                left.append(rid)
                continue
            if not self.kv.allocate(seq, n):
                if catch_up:
                    self.kv.free(seq)
                    seq.num_computed_tokens = 0
                    out.pop(rid, None)
                else:
                    left.append(rid)
                continue
            scheduled.append(ScheduledRequest(seq, n))
            budget -= n
            if n < todo:
                left.append(rid)
        if not scheduled:  # nothing could run: give up on the rest rather than spin
            if catch_up:
                for rid in left:
                    out.pop(rid, None)
                return []
            return left
        self._run(scheduled, by_id, out)
        return left

    def _run(self, scheduled: list[ScheduledRequest], by_id, out) -> None:
        """One pass of the draft runner (a step like the target's: ``execute``, read at once): the
        requests that reach their last token append a draft, drawn from the draft's logits."""
        output = self.runner.execute(self.sent.build(scheduled, self.kv.table)).get_output()
        sampling = [s.request for s in scheduled if s.is_sampling]
        for s in scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        if not sampling:
            return
        reqs = [by_id[seq.request_id] for seq in sampling]
        if all(r.params.temperature <= 0 for r in reqs):
            # Greedy drafts: the argmax (the draft's rows are greedy), with q one-hot on it (``None``
            # rows: the rejection sampler's n-gram form). A greedy target never reads q.
            for seq, (token,) in zip(sampling, output.runs, strict=True):
                seq.tokens.append(token)
                out[seq.request_id][0].append(token)
                out[seq.request_id][1].append(None)
            return
        positions = to_device(np.asarray([seq.num_tokens for seq in sampling], dtype=np.int64), self.device)
        sampled, q = draw_drafts(output.logits, draft_sampling_params(reqs, self.device,
                                                                      output.logits.shape[-1]), positions)
        for i, (seq, token) in enumerate(zip(sampling, sampled.tolist(), strict=True)):
            seq.tokens.append(token)
            out[seq.request_id][0].append(token)
            out[seq.request_id][1].append(q[i])


def _stack_probs(tokens: list[int], qs: list[torch.Tensor | None], vocab: int) -> torch.Tensor | None:
    """q of a request's drafts [len(tokens), vocab]: None when every draft was greedy (one-hot, as the
    rejection sampler reads None), one-hot rows for greedy passes mixed with sampled ones."""
    if all(q is None for q in qs):
        return None
    dev = next(q for q in qs if q is not None).device
    return torch.stack([q if q is not None else one_hot_probs(to_device(np.asarray([t]), dev), vocab)[0]
                        for t, q in zip(tokens, qs, strict=True)])

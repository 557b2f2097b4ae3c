"""DraftPasses: a draft model's k passes queued on the device right after a verify step sampled, from
that step's device outputs (MRv2's propose-after-sample, with no host read in between).

Owns the acceptance update on the device (how many drafts each request's run accepted, the position of
its new last token, its last two verified tokens), the passes (graph replays of the draft runner: the
last two verified tokens, then one draft a pass), the draft blocks they may write in the worst case
(every draft accepted), and the draft's bookkeeping when the step is read. The target's runner calls it
(worker/drafter.py) after a uniform verify replay; the DraftModelProposer owns the shadow sequences and
the draft pool. The same passes run whether the host reads the step before the next one is launched
(synchronous) or not (async scheduling): the next step gathers the drafts from the device either way.

The first pass feeds each request's last two verified tokens (one of them already in the draft cache
unless every draft passed): a uniform query of 2, so no per-request count is needed on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.engine.scheduler import ScheduledRequest
from minirunner.spec_decode.draft_sampling import draft_sampling_params, draw_drafts
from minirunner.spec_decode.proposer import DraftInput
from minirunner.worker.async_output import DeviceDrafts
from minirunner.worker.cudagraph import GraphKey, GraphKind
from minirunner.worker.input_batch import graph_rows


class DraftPasses:
    def __init__(self, proposer):
        self.proposer = proposer  # a DraftModelProposer
        self.runner = proposer.runner
        self.num_launches = 0
        self._latest: dict[str, int] = {}  # request id -> the launch that last wrote its draft K/V

    def ready(self, req_ids: list[str], starts: list[int], drafts: list[list[int]], bucket: int, k: int,
              ahead: bool) -> bool:
        """May the passes follow this verify step? The draft runner replays ``bucket`` for 2- and
        1-token rows; each request's block table has room for every draft written in the worst case
        (all accepted now; the drafts past its max_len are cut when the step is read); and
        (unless the step was built from drafts proposed on the device, ``ahead``) each request's draft
        cache holds its tokens through the last draft but one it verifies (after any proposal)."""
        graphs, n = self.runner.graphs, len(req_ids)
        if k < 1 or graphs is None or graphs.bucket(n, 2) != bucket or graphs.bucket(n, 1) != bucket:
            return False
        seqs, width = self.proposer.seqs, self.runner.max_blocks_per_seq * self.runner.block_size
        for rid, start, d in zip(req_ids, starts, drafts, strict=True):
            seq = seqs.get(rid)
            if seq is None or start + len(d) + k + 1 > width:
                return False
            if not ahead and (seq.num_verified < start + 1 or seq.num_computed_tokens < start + len(d)
                              or seq.tokens[start + 1:start + 1 + len(d)] != d):
                return False
        return True

    def launch(self, requests: list[DraftInput], k: int, bucket: int, start: torch.Tensor,
               ids: torch.Tensor, runs: torch.Tensor, capacity: list[int]) -> DeviceDrafts | None:
        """Queue the k passes after a verify step whose inputs were ``ids`` (int64 [n, q], the first at
        position ``start`` [n]) and whose emitted runs are ``runs`` ([n, q], -1 after each ends). Reads
        nothing back. ``capacity``: the tokens each request's draft cache may come to hold (blocks
        are taken now). None: the draft pool cannot hold that (nothing is queued)."""
        kv, seqs = self.proposer.kv, [self.proposer.seqs[r.request_id] for r in requests]
        for seq, cap in zip(seqs, capacity, strict=True):
            if not kv.allocate(seq, max(0, cap - seq.num_computed_tokens)):
                return None
        runner, n = self.runner, len(requests)
        runner.update_states(self.proposer.sent.build([ScheduledRequest(s, 1) for s in seqs], kv.table))
        tables, _ = graph_rows(runner.state, np.asarray([runner.state.row_of[s.request_id] for s in seqs]),
                               sampling=False)
        runner.buffers.put_graph_rows(tables, None, bucket, own_host=True)
        # the acceptance update: drafts accepted, the new last token's position, the tokens before it
        a = (runs >= 0).sum(dim=1, keepdim=True) - 1
        start = start + a[:, 0] + 1
        before, last = ids.gather(1, a)[:, 0], runs.gather(1, a)[:, 0]
        sampled = any(r.params.temperature > 0 for r in requests)
        params = draft_sampling_params(requests, runner.device, self.runner.model.config.vocab_size) \
            if sampled else None
        tokens, qs = [], []
        step_ids, positions = torch.stack((before, last), 1), torch.stack((start - 1, start), 1)
        for j in range(k):
            runner.buffers.write_uniform(bucket, n, step_ids, positions)
            q_len = step_ids.shape[1]
            best, logits = runner.graphs.run(GraphKey(bucket, GraphKind.GREEDY, q_len))
            # each request's last token row (views: no index tensor)
            best, logits = best.view(bucket, q_len)[:n, -1], logits.view(bucket, q_len, -1)[:n, -1]
            if sampled:
                token, q = draw_drafts(logits, params, start + j + 1)
                qs.append(q)
            else:
                token = best
            # a copy: ``best`` lives in the graph's output memory, which the next replay may reuse
            tokens.append(token.clone())
            step_ids, positions = token[:, None], (start + j + 1)[:, None]
        self.num_launches += 1
        for r in requests:
            self._latest[r.request_id] = self.num_launches
        q = torch.stack(qs, 1).reshape(n * k, -1) if sampled else None
        return DeviceDrafts([r.request_id for r in requests], k, start, last, torch.stack(tokens, 1), q)

    def read(self, drafts: DeviceDrafts, launch: int, verified: dict[str, list[int]],
             tokens: list[list[int]]) -> None:
        """The step those passes followed was read: each live request's shadow sequence holds its
        ``verified`` tokens and the k drafts (``tokens``, in ``drafts.req_ids`` order), with K/V through
        the last draft but one. A request no later launch wrote gives back the blocks past that."""
        for rid, toks in zip(drafts.req_ids, tokens, strict=True):
            seq, known = self.proposer.seqs.get(rid), verified.get(rid)
            if seq is None or known is None:
                continue
            seq.tokens = known + toks
            seq.num_verified = len(known)
            self.proposer.set_computed(rid, len(known) - 1 + drafts.k)
            if self._latest.get(rid) == launch:
                self.proposer.kv.trim(seq)

    def free(self, request_id: str) -> None:
        self._latest.pop(request_id, None)

"""DraftPasses: a draft model's passes after a target step, queued inside ``execute`` right after the
target sampled (MRv2's propose-after-sample).

Owns what each pass feeds and where it writes. The first pass feeds the draft the target's query tokens
at their positions and slots (the target's block ids), with the token the target just sampled put at
its place: after a request's known tokens and accepted drafts (over the first rejected one, or one past
the query when every draft passed). So the draft's cache holds K/V for every token the target computed,
and its logits at the sampled token give the first draft. The next k - 1 passes feed one draft each, at
the slots the scheduler set aside past the step (its lookahead); a position past a request's blocks or
past max_model_len writes nothing (slot -1), and the drafts there are cut when the step is read. With
k = 0 the first pass only feeds the query: the draft's cache keeps step with the target's.

Two forms. After a graph step (decode, or a uniform verify step) everything stays on the device: the
query is read back from the step buffers, the accepted counts from the emitted runs, and each pass is a
graph replay of the draft over the same buffers (no host read). After an eager step the step is read
first and every pass is planned on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.attention import AttentionMetadata
from minirunner.core.host_copy import to_device
from minirunner.kv.block_table import cdiv, slot_of
from minirunner.spec_decode.draft_sampling import draft_sampling_params, draw_drafts
from minirunner.worker.async_output import DeviceDrafts
from minirunner.worker.cudagraph import GraphKey, GraphKind


class DraftPasses:
    def __init__(self, draft, buffers, state):
        self.draft, self.buffers, self.state = draft, buffers, state  # a DraftModel, the target's parts
        self.device, self.block_size = draft.device, draft.block_size
        self.max_model_len = draft.max_model_len
        self.num_graph_launches = 0  # proposals made on the device with no host read

    # -- shared --------------------------------------------------------------------------------------
    def _limits(self, rows: np.ndarray) -> np.ndarray:
        """Per row, the positions with a slot: those inside its blocks and under max_model_len."""
        return np.minimum(self.state.num_written[rows] * self.block_size, self.max_model_len)

    def _draw(self, logits: torch.Tensor, best: torch.Tensor | None, params, positions: torch.Tensor):
        """One draft per row: the argmax (greedy batch: ``params`` None) or drawn with the request's own
        sampling (noise keyed by the drawn token's position). Returns (tokens, q or None)."""
        if params is None:
            return (logits.argmax(dim=-1) if best is None else best), None
        return draw_drafts(logits, params, positions)

    def _params(self, requests):
        sampled = any(r.params.temperature > 0 for r in requests)
        return draft_sampling_params(requests, self.device, self.draft.vocab_size) if sampled else None

    # -- after a graph step: the device only ---------------------------------------------------------
    def graph_fits(self, bucket: int, n: int, query_len: int, k: int) -> bool:
        """Can the passes after a graph step of ``bucket`` rows replay the draft's graphs (the same
        bucket at the first pass's and at one token a row)?"""
        graphs = self.draft.graphs
        first = query_len + (k > 0)
        return graphs is not None and graphs.bucket(n, first) == bucket \
            and (k < 2 or graphs.bucket(n, 1) == bucket)

    def after_graph_step(self, bucket: int, query_len: int, sampled: torch.Tensor, requests, rows: np.ndarray,
                         k: int, max_seq_len: int) -> DeviceDrafts | None:
        """The passes after a graph step over the first n rows of the buffers (every row one known token
        then ``query_len`` - 1 drafts; ``sampled`` its tokens [n] or emitted runs [n, query_len], -1 after
        each run ends). ``max_seq_len``: an upper bound on every row's length after the passes (the
        compiled steps' context rung). None when k = 0 (the first pass only)."""
        b, n, q = self.buffers, len(requests), query_len
        ids = b.input_ids[:n * q].view(n, q).clone()  # the passes rewrite the buffers
        start = b.positions[:n * q].view(n, q)[:, 0].clone()
        runs = sampled.view(n, -1)
        accepted = (runs >= 0).sum(dim=1) - 1
        last = runs.gather(1, accepted[:, None])[:, 0]
        limit = to_device(self._limits(rows), self.device)
        if k > 0:  # the sampled token goes in after the accepted drafts
            ids = torch.cat((ids, ids.new_zeros(n, 1)), 1).scatter_(1, (accepted + 1)[:, None], last[:, None])
        q0 = ids.shape[1]
        best, logits = self._replay(bucket, n, ids, start[:, None] + torch.arange(q0, device=self.device),
                                    limit, max_seq_len)
        if k == 0:
            return None
        pos = start + accepted + 1  # the sampled token's position
        index = torch.arange(n, device=self.device) * q0 + accepted + 1
        params = self._params(requests)
        token, q_rows = self._draw(logits[index], best[index], params, pos + 1)
        tokens, qs = [token.clone()], [q_rows]
        for j in range(1, k):
            best, logits = self._replay(bucket, n, tokens[-1][:, None], (pos + j)[:, None], limit,
                                        max_seq_len)
            token, q_rows = self._draw(logits[:n], best[:n], params, pos + j + 1)
            tokens.append(token.clone())  # the next replay may reuse the graph's output memory
            qs.append(q_rows)
        self.num_graph_launches += 1
        return self._proposed(requests, rows, k, pos, last, tokens, qs)

    def _replay(self, bucket: int, n: int, ids: torch.Tensor, positions: torch.Tensor, limit: torch.Tensor,
                max_seq_len: int):
        """One draft replay of ``ids`` at ``positions`` ([n, q] each) over the target's block tables in
        the buffers: (argmax of every token row, their logits)."""
        b = self.buffers
        capped = positions.clamp(max=self.max_model_len - 1)
        slots = slot_of(b.block_tables[:n].long(), capped, self.block_size)
        slots = torch.where(positions < limit[:, None], slots, torch.full_like(slots, -1))
        b.write_uniform(bucket, n, ids, capped, slots=slots)
        return self.draft.graphs.run(GraphKey(bucket, GraphKind.GREEDY, ids.shape[1]), max_seq_len)

    # -- after an eager step: the step read, every pass planned on the host ----------------------------
    def after_eager_step(self, query_ids: torch.Tensor, feeds: list[tuple[int, int, int, int, int | None]],
                         requests, k: int) -> DeviceDrafts | None:
        """The passes after an eager step whose query tokens are ``query_ids`` (its input buffer, on the
        device). ``feeds``: per scheduled request in batch order, (state row, first position, offset of
        its query in ``query_ids``, how many of its query tokens to feed, the token it just sampled to
        feed after them, or None: it does not draft); ``requests``: the drafting ones' worker states."""
        rows = np.asarray([f[0] for f in feeds], dtype=np.int64)
        starts = np.asarray([f[1] for f in feeds], dtype=np.int64)
        drafting = np.asarray([f[4] is not None for f in feeds], dtype=bool)
        lens = np.asarray([f[3] for f in feeds], dtype=np.int64) + drafting
        total = int(lens.sum())
        if not total:
            return None
        first = np.cumsum(lens) - lens
        offsets = np.arange(total) - np.repeat(first, lens)
        # each fed token's row in query_ids (a sampled token: any row, overwritten next)
        src = np.repeat(np.asarray([f[2] for f in feeds], dtype=np.int64), lens) + offsets
        ends = first + lens - 1  # each request's last fed token
        src[ends[drafting]] = 0
        ids = query_ids[to_device(src, self.device)]
        if drafting.any():
            ids[to_device(ends[drafting], self.device)] = to_device(
                np.asarray([f[4] for f in feeds if f[4] is not None], dtype=np.int64), self.device)
        hidden = self.draft.forward(ids, self._eager_meta(np.repeat(rows, lens), np.repeat(starts, lens)
                                                          + offsets, lens, starts + lens))
        if k == 0 or not drafting.any():
            return None
        rows, pos = rows[drafting], (starts + lens - 1)[drafting]
        logits = self.draft.model.compute_logits(hidden[to_device(ends[drafting], self.device)])
        params = self._params(requests)
        pos_dev = to_device(pos, self.device)
        token, q_rows = self._draw(logits, None, params, pos_dev + 1)
        tokens, qs, m = [token], [q_rows], len(rows)
        for j in range(1, k):
            step = np.minimum(pos + j, self.max_model_len - 1)
            hidden = self.draft.forward(tokens[-1], self._eager_meta(rows, pos + j, np.ones(m, np.int64),
                                                                     step + 1))
            token, q_rows = self._draw(self.draft.model.compute_logits(hidden), None, params, pos_dev + j + 1)
            tokens.append(token)
            qs.append(q_rows)
        last = ids[to_device(ends[drafting], self.device)]
        return self._proposed(requests, rows, k, pos_dev, last, tokens, qs)

    def _eager_meta(self, token_rows: np.ndarray, positions: np.ndarray, lens: np.ndarray,
                    seq_lens: np.ndarray) -> AttentionMetadata:
        """Host-planned metadata of one eager draft pass: each token's state row and position, each
        sequence's query length and length. Positions past max_model_len are capped and write nothing."""
        capped = np.minimum(positions, self.max_model_len - 1)
        seq_lens = np.minimum(seq_lens, self.max_model_len).astype(np.int32)
        tables = self.state.block_tables
        slots = slot_of(tables, capped, self.block_size, token_rows)
        slots[positions >= self._limits(token_rows)] = -1
        qsl = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens, out=qsl[1:])
        seq_rows = token_rows[qsl[1:] - 1]
        max_seq_len = int(seq_lens.max())
        tables_cpu = torch.from_numpy(tables[seq_rows, :cdiv(max_seq_len, self.block_size)])
        dev = self.device
        return AttentionMetadata(
            positions=to_device(capped.astype(np.int64), dev), slot_mapping=to_device(slots, dev),
            query_start_loc=to_device(qsl, dev), seq_lens=to_device(seq_lens, dev),
            block_tables=to_device(tables_cpu.numpy(), dev), query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens_cpu=torch.from_numpy(seq_lens), max_query_len=int(lens.max()), max_seq_len=max_seq_len,
            block_size=self.block_size, block_tables_cpu=tables_cpu)

    def _proposed(self, requests, rows: np.ndarray, k: int, pos: torch.Tensor, last: torch.Tensor,
                  tokens: list[torch.Tensor], qs: list) -> DeviceDrafts:
        """The step's drafts, kept in the draft's device rows too."""
        tokens = torch.stack(tokens, 1)
        q = None if qs[0] is None else torch.stack(qs, 1).reshape(len(requests) * k, -1)
        self.draft.rows.write(rows, pos, last, tokens)
        return DeviceDrafts([r.req_id for r in requests], k, pos, last, tokens, q, rows)

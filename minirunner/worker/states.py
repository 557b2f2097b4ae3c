"""The worker's own per-request state (MRv2's request state): one row per running request, filled
from the scheduler's data (core/sched/output.py), kept across steps so a step writes only what changed.

Owns row assignment (a free list that doubles when full), each row's block-table row (the only writer:
new ids appended, or the row rewritten when the scheduler says its table was replaced or edited), its
sampling parameters and seed, and its token ids (prompt and outputs known, then each step's query tokens
and drafts at their positions). For the GPU-native input path it records which block-table cells
changed since it was last drained (worker/state_mirror.py copies just those to the device). It never
allocates KV blocks, never reads an engine object and never touches device tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minirunner.core.sched.output import NewRequestData, SchedulerOutput
from minirunner.sampling_params import SamplingParams

_SEED_MASK = (1 << 63) - 1


@dataclass(slots=True, eq=False)
class CachedRequestState:
    """One request as the worker knows it (vLLM's ``CachedRequestState``): ``token_ids`` int64, valid
    up to ``num_tokens`` (the prompt, then outputs); the logits processors and logprobs read it."""

    req_id: str
    params: SamplingParams
    seed: int
    eos_token_ids: frozenset[int]
    num_prompt_tokens: int
    token_ids: np.ndarray
    num_tokens: int
    prompt_logprobs_from: int | None = None
    max_len: int = 0
    num_known: int = 0  # tokens the worker knows (a prefill chunk may end before the last of them)
    grammar_bitmask: np.ndarray | None = None  # this step's, from the scheduler (structured output)

    @property
    def prompt_token_ids(self) -> np.ndarray:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> np.ndarray:
        return self.token_ids[self.num_prompt_tokens:self.num_tokens]

    def write_tokens(self, start: int, known: np.ndarray, drafts: list[int]) -> None:
        """A step's query: its known tokens from position ``start`` (then ``num_tokens`` ends there),
        and its drafts after them (kept past ``num_tokens``: the accepted ones stay valid)."""
        end = start + len(known) + len(drafts)
        if end > len(self.token_ids):
            grown = np.zeros(max(end, 2 * len(self.token_ids)), dtype=np.int64)
            grown[:len(self.token_ids)] = self.token_ids  # drafts past num_tokens included
            self.token_ids = grown
        self.token_ids[start:start + len(known)] = known
        self.token_ids[start + len(known):end] = drafts
        self.num_tokens = start + len(known)
        self.num_known = max(self.num_known, self.num_tokens)


class RequestStateRows:
    """Persistent per-request rows: block-table rows, sampling parameters and ``requests`` (the
    CachedRequestState of each row, None when free). A request keeps its row while it runs."""

    def __init__(self, capacity: int, max_blocks: int):
        self.block_tables = np.zeros((capacity, max_blocks), dtype=np.int32)
        self.num_written = np.zeros(capacity, dtype=np.int64)
        self.temperature = np.zeros(capacity, dtype=np.float32)
        self.top_k = np.zeros(capacity, dtype=np.int64)
        self.top_p = np.ones(capacity, dtype=np.float32)
        self.seed = np.zeros(capacity, dtype=np.int64)
        self.requests: list[CachedRequestState | None] = [None] * capacity
        self.row_of: dict[str, int] = {}
        self.masked: list[str] = []  # requests holding the last step's grammar bitmask
        self.num_prompt_logprobs = 0  # rows whose request asks for prompt logprobs
        self.free = list(range(capacity - 1, -1, -1))
        # row -> [first, end) of the block-table columns written since the last drain_writes (None: not
        # recorded)
        self._written: dict[int, tuple[int, int]] | None = None

    def _grow(self) -> None:
        cap = len(self.requests)
        for name in ("block_tables", "num_written", "temperature", "top_k", "top_p", "seed"):
            old = getattr(self, name)
            new = np.zeros((2 * cap, *old.shape[1:]), dtype=old.dtype)
            new[:cap] = old
            setattr(self, name, new)
        self.requests += [None] * cap
        self.free = list(range(2 * cap - 1, cap - 1, -1)) + self.free

    def add(self, new: NewRequestData) -> int:
        """A row for a request the worker has not seen (or forgot): its parameters, tokens and blocks."""
        self.release(new.req_id)
        if not self.free:
            self._grow()
        row = self.free.pop()
        self.row_of[new.req_id] = row
        p = new.sampling_params
        self.temperature[row], self.top_k[row], self.top_p[row] = p.temperature, p.top_k, p.top_p
        self.seed[row] = new.seed & _SEED_MASK
        tokens = np.asarray(list(new.prompt_token_ids) + list(new.output_token_ids), dtype=np.int64)
        self.requests[row] = CachedRequestState(
            new.req_id, p, new.seed, new.eos_token_ids, len(new.prompt_token_ids), tokens, len(tokens),
            new.prompt_logprobs_from, new.max_len, len(tokens))
        self.num_prompt_logprobs += new.prompt_logprobs_from is not None
        self.write_blocks(row, new.block_ids, replace=True)
        return row

    def update(self, sched: SchedulerOutput) -> None:
        """Bring the rows up to date with a step's data: rows for its new requests, and the new block
        ids of its running ones, and the step's grammar bitmasks."""
        for new in sched.scheduled_new_reqs:
            self.add(new)
        cached = sched.scheduled_cached_reqs
        for rid, ids, replace in zip(cached.req_ids, cached.new_block_ids, cached.replace_block_ids,
                                     strict=True):
            self.write_blocks(self.row_of[rid], ids, replace)
        for rid in self.masked:  # a grammar bitmask holds for its step only
            if rid in self.row_of:
                self.requests[self.row_of[rid]].grammar_bitmask = None
        self.masked = list(sched.grammar_bitmask)
        for rid, mask in sched.grammar_bitmask.items():
            self.requests[self.row_of[rid]].grammar_bitmask = mask

    def write_blocks(self, row: int, block_ids: list[int], replace: bool = False) -> None:
        """Append ``block_ids`` to the row's table, or (``replace``) make them the whole table."""
        done = 0 if replace else int(self.num_written[row])
        end = done + len(block_ids)
        self.block_tables[row, done:end] = block_ids
        self.num_written[row] = end
        if self._written is not None and end > done:
            first, last = self._written.get(row, (done, end))
            self._written[row] = (min(first, done), max(last, end))

    # -- the record of changed cells, for the device mirror (worker/state_mirror.py) ----------------
    def record_writes(self, on: bool = True) -> None:
        """From now on, remember (``on``) or not which block-table cells are written (each until
        ``drain_writes``)."""
        self._written = {} if on else None

    def drain_writes(self) -> tuple[np.ndarray, np.ndarray]:
        """The block-table cells written since the last drain, once each, and forget them: (flat
        indices row * max_blocks + column, int64 [n]; their block ids, int32 [n])."""
        written, self._written = self._written, {}
        if not written:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
        rows = np.fromiter(written, dtype=np.int64, count=len(written))
        first, end = np.array(list(written.values()), dtype=np.int64).T
        counts = end - first
        # every row's columns first .. end - 1, rows one after another
        cols = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - first, counts)
        rows = np.repeat(rows, counts)
        return rows * self.block_tables.shape[1] + cols, self.block_tables[rows, cols]

    def prompt_spans(self, sched: SchedulerOutput) -> list[tuple]:
        """(request id, prompt ids, k, first position to score, start, query tokens) of each scheduled
        request in batch order: what prompt logprobs read (minirunner/logprobs.py)."""
        if not self.num_prompt_logprobs:  # the common case: no live request asks
            return []
        computed, spans = sched.num_computed_tokens(), []
        for rid, n in sched.num_scheduled_tokens.items():
            r = self.requests[self.row_of[rid]]
            spans.append((rid, r.prompt_token_ids, r.params.prompt_logprobs, r.prompt_logprobs_from,
                          computed[rid], n))
        return spans

    def release(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.num_prompt_logprobs -= self.requests[row].prompt_logprobs_from is not None
            self.requests[row] = None
            self.free.append(row)

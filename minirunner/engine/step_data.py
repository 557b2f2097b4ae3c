"""WorkerRowsSent: the engine's record of what each worker row holds, and the step's SchedulerOutput
(core/sched/output.py) built from it.

Owns that record (per request: the block table last sent, its version, how many ids) and turning a step's
scheduled requests into data: a new request's prompt, params, seed and blocks; a running one's new block
ids (or its whole table when the table was replaced or edited). It never runs the model.
"""

from __future__ import annotations

from collections.abc import Callable

from minirunner.core.sched.output import NewRequestData, SchedulerOutput
from minirunner.kv.block_table import BlockTable


class WorkerRowsSent:
    def __init__(self):
        self._sent: dict[str, tuple[BlockTable, int, int]] = {}  # request id -> (table, version, ids sent)

    def forget(self, request_id: str) -> None:
        """The worker drops the request's row (finished, aborted or preempted): send it anew next time."""
        self._sent.pop(request_id, None)

    def build(self, scheduled, table_of: Callable[[str], BlockTable]) -> SchedulerOutput:
        """The step's data. ``scheduled``: ScheduledRequests (engine/scheduler.py), in batch order;
        ``table_of``: a request id's block table."""
        out = SchedulerOutput()
        cached = out.scheduled_cached_reqs
        for s in scheduled:
            r, rid, n, start = s.request, s.request.request_id, s.num_new_tokens, s.start
            table = table_of(rid)
            known = max(0, min(n - len(s.draft_token_ids), r.num_tokens - start))
            out.num_scheduled_tokens[rid] = n
            out.new_token_ids[rid] = r.token_buffer[start:start + known].copy()
            if s.draft_token_ids:
                out.scheduled_spec_decode_tokens[rid] = list(s.draft_token_ids)
            if known + len(s.draft_token_ids) < n:
                out.in_flight_req_ids.add(rid)
            if s.is_sampling:
                out.sampling_req_ids.add(rid)
            sent = self._sent.get(rid)
            if sent is None:
                out.scheduled_new_reqs.append(NewRequestData(
                    rid, list(r.prompt_token_ids), r.params, r.seed, list(table.blocks), start,
                    list(r.output_token_ids), r.eos_token_ids, _prompt_logprobs_from(r), r.max_len))
            else:
                replace = sent[0] is not table or sent[1] != table.version
                cached.req_ids.append(rid)
                cached.new_block_ids.append(list(table.blocks[0 if replace else sent[2]:]))
                cached.replace_block_ids.append(replace)
                cached.num_computed_tokens.append(start)
            self._sent[rid] = (table, table.version, len(table.blocks))
        return out


def _prompt_logprobs_from(request) -> int | None:
    """The first prompt position to score: completion 0 only, and nothing scored twice (a preempted
    request's ``prompt_logprobs`` holds None for token 0, then one entry per token scored)."""
    if request.params.prompt_logprobs is None or request.index != 0:
        return None
    return (len(request.prompt_logprobs) if request.prompt_logprobs else 1) - 1

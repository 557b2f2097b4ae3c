"""The worker boundary: each step crosses it as data (core/sched/output.py), and the worker's own rows
(worker/states.py) hold what the engine's requests hold, through chunked prefill, prefix caching,
preemption, n > 1 forks and speculative rollback."""

from __future__ import annotations

import dataclasses

import numpy as np
from test_spec_decode import _prompts, _spec, pair  # noqa: F401

from minirunner import LLM, SamplingParams
from minirunner.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

_DATA = (str, int, float, bool, type(None), np.ndarray, np.integer, SamplingParams)


def _only_data(value, path="output") -> None:
    """Raise if ``value`` reaches anything but plain data (no Request, no KV manager, no table)."""
    if isinstance(value, (SchedulerOutput, NewRequestData, CachedRequestData)):
        for f in dataclasses.fields(value):
            _only_data(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _only_data(k, path)
            _only_data(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _only_data(v, path)
    else:
        assert isinstance(value, _DATA), f"{path} holds a {type(value).__name__}"


def test_each_step_crosses_as_data_and_the_worker_rows_follow_the_requests(pair):  # noqa: F811
    llm = LLM(pair["target"], device="cpu", attention_backend="torch", block_size=4, num_kv_blocks=30,
              max_num_seqs=4, max_num_batched_tokens=24, enable_prefix_caching=True,
              speculative_config=_spec(pair, "ngram", 3))
    engine, runner = llm.engine, llm.engine.runner
    schedule = engine.scheduler.schedule
    seen = []

    def schedule_and_check(*args):
        step = schedule(*args)
        _only_data(step.output)
        seen.append(step.output)
        return step

    engine.scheduler.schedule = schedule_and_check
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for p in _prompts(6):
        engine.add_request(p, greedy)
    engine.add_request(_prompts(1, seed=5)[0], SamplingParams(temperature=0.8, seed=1, n=2, max_tokens=12))
    while engine.has_unfinished_requests():
        engine.step()
        for request in engine.scheduler.running:
            row = runner.state.row_of.get(request.request_id)
            if row is None:
                continue
            state = runner.state.requests[row]
            n = state.num_tokens
            assert 0 < n <= request.num_tokens
            assert state.token_ids[:n].tolist() == request.all_token_ids[:n]
            assert state.prompt_token_ids.tolist() == request.prompt_token_ids
            assert runner.state.block_tables[row, :len(engine.kv.table(request.request_id))].tolist() \
                == engine.kv.table(request.request_id).blocks
    assert any(o.scheduled_cached_reqs.replace_block_ids and any(o.scheduled_cached_reqs.replace_block_ids)
               for o in seen)  # tables rewritten: rollback or copy-on-write
    assert any(o.scheduled_spec_decode_tokens for o in seen)
    assert sum(len(o.scheduled_new_reqs) for o in seen) > 8  # admissions, forks and re-admissions

"""Notebook 06 counts a speculative step's operators against a plain step's: the verify path is dearer
than one plain step, and most of what it adds is outside the target model."""

from __future__ import annotations

import pytest

from minirunner import LLM, SamplingParams
from minirunner.tools.profiling import record_decode_step, record_verify_step


def in_model(count) -> int:
    return sum(1 for r in count.records if r.where.split("@")[-1].startswith("model"))


@pytest.fixture(scope="module")
def engines():
    kw = dict(device="cpu", attention_backend="torch", num_threads=1)
    return LLM(**kw), LLM(**kw, speculative_config={"method": "draft_model", "num_speculative_tokens": 3})


def test_a_verify_step_dispatches_more_than_a_plain_step_and_mostly_outside_the_model(engines):
    plain, spec = engines
    p, s = record_decode_step(plain), record_verify_step(spec)
    assert s.total > p.total
    assert s.total - p.total > in_model(s) - in_model(p) > 0  # the k + 1 rows add little inside the model
    assert not spec.engine.has_unfinished_requests()  # the engine is left idle


def test_a_busy_engine_is_refused(engines):
    _, spec = engines
    spec.engine.add_request([5, 6, 7], SamplingParams(max_tokens=4))
    try:
        with pytest.raises(ValueError, match="idle engine"):
            record_verify_step(spec)
    finally:
        spec.engine.abort_all(list(spec.engine.requests))

"""GET /metrics: the engine's metric records rendered as Prometheus text that prometheus_client's own
parser reads back with the same names, types, labels and values."""

from __future__ import annotations

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from minirunner import LLM, SamplingParams  # noqa: E402
from minirunner.metrics.prometheus import render  # noqa: E402
from minirunner.metrics.reader import Counter, Gauge, Histogram, Vector  # noqa: E402

LABELS = {"engine": "0", "model_name": 'a "quoted"\\name'}


def _parse(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_each_kind_round_trips_through_prometheus_parser():
    records = [Counter("vllm:prompt_tokens", LABELS, 12, documentation="Prompt tokens."),
               Counter("vllm:request_success", {**LABELS, "finished_reason": "stop"}, 3),
               Counter("vllm:request_success", {**LABELS, "finished_reason": "length"}, 4),
               Gauge("vllm:kv_cache_usage_perc", LABELS, 0.25),
               Histogram("vllm:time_to_first_token_seconds", LABELS, count=3, sum=0.7,
                         buckets={"0.1": 1, "0.5": 2, "+Inf": 3}),
               Vector("vllm:spec_decode_num_accepted_tokens_per_pos", LABELS, [5, 2])]
    families = _parse(render(records))
    assert families["vllm:prompt_tokens"].type == "counter"
    assert families["vllm:prompt_tokens"].documentation == "Prompt tokens."
    [sample] = families["vllm:prompt_tokens"].samples
    assert sample.name == "vllm:prompt_tokens_total" and sample.value == 12 and sample.labels == LABELS
    success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples}
    assert success == {"stop": 3, "length": 4}
    assert families["vllm:kv_cache_usage_perc"].samples[0].value == 0.25
    hist = {(s.name, s.labels.get("le")): s.value
            for s in families["vllm:time_to_first_token_seconds"].samples}
    assert hist == {("vllm:time_to_first_token_seconds_bucket", "0.1"): 1,
                    ("vllm:time_to_first_token_seconds_bucket", "0.5"): 2,
                    ("vllm:time_to_first_token_seconds_bucket", "+Inf"): 3,
                    ("vllm:time_to_first_token_seconds_sum", None): 0.7,
                    ("vllm:time_to_first_token_seconds_count", None): 3}
    per_pos = {s.labels["position"]: s.value
               for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
    assert per_pos == {"0": 5, "1": 2}


def test_an_engine_s_metrics_render_with_vllm_names():
    llm = LLM(num_threads=1)
    outs = llm.generate(["ROMEO:", "JULIET:"], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    families = _parse(render(llm.get_metrics()))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions",
                 "vllm:request_success", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"):
        assert name in families, name
    value = {s.name: s.value for f in families.values() for s in f.samples
             if "finished_reason" not in s.labels}
    assert value["vllm:generation_tokens_total"] == 10
    assert value["vllm:prompt_tokens_total"] == sum(len(o.prompt_token_ids) for o in outs)
    assert value["vllm:e2e_request_latency_seconds_count"] == 2

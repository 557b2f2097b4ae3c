"""`minirunner serve` under concurrency: 24 simultaneous streams each equal their offline result, and a
client that drops its stream has its request aborted and its KV blocks freed (seen in /metrics)."""

from __future__ import annotations

import json
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
from serve_helpers import Server  # noqa: E402

from minirunner import LLM, SamplingParams  # noqa: E402

MODEL = "shakespeare"
ABORTED = "vllm:request_success_total[('finished_reason', 'abort')]"
PROMPTS = ["ROMEO:", "JULIET:", "HAMLET:", "First Citizen:", "KING HENRY:", "Nurse:"]


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def test_24_concurrent_streams_each_equal_offline(server):
    requests = [dict(prompt=PROMPTS[i % len(PROMPTS)], seed=1000 + i, max_tokens=16 + i % 5 * 4,
                     temperature=0.8, top_p=0.95, stop=["\n\n"] if i % 3 == 0 else None) for i in range(24)]

    async def one(client, req):
        stream = await client.completions.create(model=MODEL, stream=True, **req)
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    results = server.run_concurrently(one, requests)
    llm = LLM(num_threads=1)
    params = [SamplingParams(**{k: v for k, v in r.items() if k != "prompt"}) for r in requests]
    offline = llm.generate([r["prompt"] for r in requests], params, use_tqdm=False)
    assert results == [(o.outputs[0].text, o.outputs[0].finish_reason) for o in offline]


def _wait_for(server, check, timeout=120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if check(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def test_a_dropped_stream_is_aborted_and_its_blocks_freed(server):
    body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 240, "ignore_eos": True, "stream": True,
            "seed": 1}
    before = server.metrics()
    with httpx.Client(timeout=60) as client, \
            client.stream("POST", server.url + "/v1/completions", json=body) as r:
        chunks = 0
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                chunks += 1
            if chunks == 3:
                m = server.metrics()
                assert m["vllm:num_requests_running"] == 1 and m["vllm:kv_cache_usage_perc"] > 0
                break
    # the response was closed after 3 tokens of 240: the server aborts the request
    m = _wait_for(server, lambda m: m["vllm:num_requests_running"] == 0)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0
    assert m[ABORTED] == before[ABORTED] + 1
    assert m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 200


def test_a_dropped_non_streaming_request_is_aborted(server):
    body = {"model": MODEL, "prompt": "JULIET:", "max_tokens": 240, "ignore_eos": True, "seed": 2}
    before = server.metrics()
    with pytest.raises(httpx.TimeoutException):  # the client gives up while the server is still working
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
    m = _wait_for(server, lambda m: m["vllm:num_requests_running"] == 0)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0
    assert m[ABORTED] == before[ABORTED] + 1


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate():
    from minirunner.tools.bench.serve import arrival_times

    times = arrival_times(4000, 8.0, seed=1)
    assert times == arrival_times(4000, 8.0, seed=1) != arrival_times(4000, 8.0, seed=2)
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    assert 4000 / times[-1] == pytest.approx(8.0, rel=0.1)
    assert arrival_times(3, float("inf"), seed=0) == [0.0, 0.0, 0.0]

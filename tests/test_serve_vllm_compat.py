"""`minirunner serve` speaking what vLLM's clients send and read, through a real server and the openai client:
prompt logprobs and echo scoring equal to offline, unknown fields ignored with one warning, /tokenize,
/detokenize, /version, vLLM's metric names, X-Request-Id, stop_reason, stream_options, the API key from the
environment, an access log, and streams cut by shutdown ending with an error event and [DONE]."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
from serve_helpers import Server  # noqa: E402

from minirunner import LLM, SamplingParams  # noqa: E402

MODEL = "shakespeare"
PROMPT = "ROMEO:\nBut soft, what light"


@pytest.fixture(scope="module")
def server():
    s = Server("--uvicorn-log-level", "info", "--api-key", "sesame")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="sesame", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def llm():
    return LLM(num_threads=1)


def _post(server, path, body, **headers):
    return httpx.post(server.url + path, json=body, timeout=60,
                      headers={"authorization": "bearer sesame", **headers})


def _offline_prompt_logprobs(llm, prompt, k):
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=k),
                       use_tqdm=False)[0]
    return out.prompt_token_ids, out.prompt_logprobs


def test_prompt_logprobs_are_returned_as_vllm_does(client, llm):
    ids, ref = _offline_prompt_logprobs(llm, PROMPT, 2)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 2})
    got = r.choices[0].model_extra["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for want, have, tid in zip(ref[1:], got[1:], ids[1:], strict=True):
        assert set(have) == {str(t) for t in want}
        assert have[str(tid)]["logprob"] == pytest.approx(want[tid].logprob, abs=1e-4)
        assert have[str(tid)]["rank"] == want[tid].rank


@pytest.mark.parametrize("max_tokens", [0, 1])
@pytest.mark.parametrize("as_ids", [False, True])
def test_echo_with_logprobs_scores_the_prompt(client, llm, max_tokens, as_ids):
    """lm-evaluation-harness's loglikelihood request: the prompt's tokens and their logprobs, first None."""
    ids, ref = _offline_prompt_logprobs(llm, PROMPT, 1)
    r = client.completions.create(model=MODEL, prompt=ids if as_ids else PROMPT, max_tokens=max_tokens,
                                  echo=True, logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    n = len(ids)
    assert len(lp.token_logprobs) == n + max_tokens
    for i in range(1, n):
        assert lp.token_logprobs[i] == pytest.approx(ref[i][ids[i]].logprob, abs=1e-4)
    assert r.choices[0].text.startswith(PROMPT)
    if max_tokens == 0:
        assert r.choices[0].text == PROMPT and r.usage.completion_tokens == 0


def test_unknown_fields_are_served(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                  extra_body={"store": True, "service_tier": "auto", "metadata": {"a": 1},
                                              "parallel_tool_calls": False})
    assert r.usage.completion_tokens == 2


def test_structured_output_fields_are_refused_not_ignored(server):
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "structural_tag": "{}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structural_tag"


def test_tokenize_detokenize_version(server, llm):
    tok = llm.get_tokenizer()
    r = _post(server, "/tokenize", {"model": MODEL, "prompt": PROMPT, "return_token_strs": True}).json()
    assert r["tokens"] == tok.encode(PROMPT) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == llm.engine.config.max_model_len
    assert r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])
    assert _post(server, "/detokenize", {"model": MODEL, "tokens": r["tokens"]}).json() == \
        {"prompt": tok.decode(r["tokens"])}
    assert _post(server, "/tokenize", {"prompt": PROMPT}, authorization="").status_code == 401
    assert isinstance(httpx.get(server.url + "/version").json()["version"], str)


def test_request_id_stop_reason_and_stream_options(server):
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 3},
              **{"x-request-id": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42" and r.json()["id"] == "cmpl-trace-42"
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "stop": ["e"], "stream": True,
            "stream_options": {}, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60,
                      headers={"authorization": "Bearer sesame"}) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0  # {} means usage
    finished = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert finished == [{**finished[0], "finish_reason": "stop", "stop_reason": "e"}]


def test_vllm_metric_names_with_the_model_label(server):
    _post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 3})
    text = httpx.get(server.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
                 "vllm:request_inference_time_seconds_count", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:request_time_per_output_token_seconds_count"):
        line = next((x for x in text.splitlines() if x.startswith(name + "{")), None)
        assert line is not None, name
        assert f'model_name="{MODEL}"' in line
    queue = next(x for x in text.splitlines() if x.startswith("vllm:request_decode_time_seconds_count"))
    assert float(queue.split()[-1]) >= 1


def test_key_from_the_environment_any_case_and_the_log():
    s = Server("--uvicorn-log-level", "info", env={"MINIRUNNER_API_KEY": "hidden"})
    try:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "store": True, "user_tag": 1}
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = httpx.post(s.url + "/v1/completions", json=body,
                           headers={"authorization": f"{scheme} hidden"})
            assert r.status_code == 200
        assert "hidden" not in " ".join(open(f"/proc/{s.proc.pid}/cmdline").read().split("\0"))
    finally:
        s.stop()
    log = s.proc.stdout.read()
    warnings = [x for x in log.splitlines() if "were present in the request but ignored" in x]
    assert len(warnings) == 3 and all("['store', 'user_tag']" in w for w in warnings)
    assert log.count('"POST /v1/completions HTTP/1.1" 200') == 3  # the access log


def test_streams_cut_by_shutdown_end_with_an_error_and_done():
    s = Server("--shutdown-timeout", "0.5", "--max-num-seqs", "1")
    ends: list[list[str]] = []
    answered = threading.Semaphore(0)

    def stream():
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}
        events = []
        try:
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
                answered.release()  # the server took the request (its stream's headers came)
                events += [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        except httpx.HTTPError as e:
            events.append(f"cut: {e}")
        ends.append(events)

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in threads:
        assert answered.acquire(timeout=60)
    time.sleep(0.5)
    assert s.stop(signal.SIGTERM) == 0
    for t in threads:
        t.join(60)
    assert len(ends) == 4
    for events in ends:
        assert events[-1] == "[DONE]", events[-3:]
    cut = [e for e in ends if "error" in json.loads(e[-2])]
    assert cut  # with one sequence at a time, 200 tokens each cannot all finish in 0.5 s

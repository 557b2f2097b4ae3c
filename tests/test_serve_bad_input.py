"""Every bad request to `minirunner serve` gets a 400 with OpenAI's error JSON (never a 500, never a hang),
and the server keeps serving the others."""

from __future__ import annotations

import json

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
from serve_helpers import Server  # noqa: E402

MODEL = "shakespeare"
OK = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 4}


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def _post(server, body, path="/v1/completions", **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=60,
                      headers={"content-type": "application/json"}, **kw)


def _assert_400(r: httpx.Response, *words: str) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
    for w in words:
        assert w in err["message"], err["message"]
    return err


@pytest.mark.parametrize("body, words", [
    (b"{not json", ["not valid JSON"]),
    (b'{"prompt": "x", "max_tokens": NaN}', ["NaN"]),
    (b'{"prompt": "x", "temperature": Infinity}', ["Infinity"]),
    (b'{"prompt": "x", "temperature": 1e999}', ["temperature"]),
    (b"[1, 2]", ["JSON object"]),
    (b"", ["not valid JSON"]),
])
def test_malformed_json(server, body, words):
    _assert_400(_post(server, body), *words)


@pytest.mark.parametrize("change, param", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"n": 2.5}, "n"),
    ({"max_tokens": True}, "max_tokens"),
    ({"logprobs": -1}, "logprobs"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"top_k": -5}, None),
    ({"seed": "x"}, "seed"),
    ({"prompt": ""}, None),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, None),
    ({"prompt": [5000]}, None),
    ({"prompt": 7}, "prompt"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
])
def test_bad_completion_fields(server, change, param):
    err = _assert_400(_post(server, {**OK, **change}))
    if param is not None:
        assert err["param"] == param


def test_logprobs_beyond_the_limit(server):
    _assert_400(_post(server, {**OK, "logprobs": 21}), "logprobs")


def test_prompt_beyond_the_context(server):
    _assert_400(_post(server, {**OK, "prompt": [5] * 300}), "max_model_len")
    err = _assert_400(_post(server, {**OK, "prompt": [5] * 250, "max_tokens": 10}), "context length")
    assert err["param"] == "max_tokens"


def test_over_large_body(server):
    r = _post(server, {**OK, "prompt": "x" * (5 << 20)})
    _assert_400(r, "limit")


def test_chunked_over_large_body(server):
    def parts():
        yield b'{"prompt": "'
        for _ in range(80):
            yield b"x" * 65536
        yield b'"}'
    r = httpx.post(server.url + "/v1/completions", content=parts(), timeout=60,
                   headers={"content-type": "application/json"})
    _assert_400(r, "limit")


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
      "chat_template": "{{ messages }}"}, "chat_template"),
])
def test_bad_chat_requests(server, body, param):
    err = _assert_400(_post(server, body, "/v1/chat/completions"))
    assert err["param"] == param


def test_openai_client_raises_bad_request_and_the_server_keeps_serving(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=-3)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="ROMEO:")
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=3)
    assert r.usage.completion_tokens == 3
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("change", [
    {"seed": 2 ** 70}, {"seed": -5}, {"top_k": 10 ** 12}, {"min_tokens": 10 ** 12},
    {"stop_token_ids": [10 ** 12]}, {"stop_token_ids": [-1]}, {"allowed_token_ids": [10 ** 12]},
    {"allowed_token_ids": []}, {"truncate_prompt_tokens": 0}, {"truncate_prompt_tokens": 10 ** 12},
    {"prompt_logprobs": 10 ** 6}, {"logit_bias": {"5": 1e30}}, {"logit_bias": {"99999": 1}},
    {"stop": [""]}, {"bad_words": [""]}, {"max_tokens": 10 ** 30}, {"prompt": [[1], [2] * 300]},
    {"n": 2, "seed": 2 ** 63 - 1}, {"echo": True, "logprobs": 1}, {"suffix": "x"},
    {"use_beam_search": True}, {"best_of": 3},
])
def test_edge_values_are_refused_or_served_never_a_500(server, change):
    """An odd value is a 400 in OpenAI's error JSON, or is served; never a 500, and the server serves the
    next request."""
    r = _post(server, {**OK, **change})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        _assert_400(r)
    ok = _post(server, OK)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4

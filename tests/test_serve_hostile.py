"""`minirunner serve` against hostile and careless clients (the serving review's defects), each through a real
server process and raw sockets or httpx: request chat templates refused, oversized prompts refused by length
before any tokenizer runs, slow headers and bodies timed out, header floods refused, connections capped,
the open-file limit raised, nested JSON and wrong content types a 400, subnormal temperatures greedy."""

from __future__ import annotations

import json
import resource
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
from serve_helpers import Server  # noqa: E402

from minirunner import LLM, SamplingParams  # noqa: E402

MODEL = "shakespeare"
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
OK = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 4, "temperature": 0}


def _low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.fixture(scope="module")
def server():
    s = Server("--header-timeout", "1", "--body-timeout", "1", "--max-connections", "12",
               preexec_fn=_low_fd_limit)
    yield s
    s.stop()


def _post(server, body, path="/v1/completions", content_type="application/json", **kw):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"content-type": content_type} if content_type else {}
    return httpx.post(server.url + path, content=content, timeout=60, headers=headers, **kw)


def _raw(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_a_request_chat_template_is_refused_unless_trusted(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "chat_template": "{% for i in range(6000) %}{% for j in range(6000) %}{% endfor %}{% endfor %}"}
    r = _post(server, body, "/v1/chat/completions")
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "chat_template"
    assert "--trust-request-chat-template" in r.json()["error"]["message"]


def test_a_trusted_template_that_renders_past_the_context_is_a_400():
    s = Server("--trust-request-chat-template", "--chat-template", "/dev/null")
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "chat_template": "{{ 'ROMEO: But soft. ' * 250000 }}"}
        r = _post(s, body, "/v1/chat/completions")
        assert r.status_code == 400
        assert "the rendered chat prompt has 4250000 characters" in r.json()["error"]["message"]
        body["chat_template"] = TEMPLATE  # a sound one still serves
        assert _post(s, {**body, "max_tokens": 3}, "/v1/chat/completions").status_code == 200
    finally:
        s.stop()


def test_a_megabyte_prompt_is_refused_by_its_length(server):
    r = _post(server, {**OK, "prompt": "ROMEO: But soft. " * 60000})
    assert r.status_code == 400
    assert "1020000 characters" in r.json()["error"]["message"]
    assert _post(server, OK).status_code == 200


def test_slow_headers_are_cut_off(server):
    sock = _raw(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    answer = _read_all(sock)  # returns once the server closes the connection
    assert answer.startswith(b"HTTP/1.1 408")


def test_a_slow_body_is_cut_off(server):
    sock = _raw(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    answer = _read_all(sock).decode()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "did not arrive" in answer


def test_oversized_headers_are_refused(server):
    r = httpx.get(server.url + "/health", headers={"x-big": "a" * (200 << 10)}, timeout=30)
    assert r.status_code == 431
    r = httpx.get(server.url + "/health", headers={f"x-h{i}": "1" for i in range(400)}, timeout=30)
    assert r.status_code == 431
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_connections_beyond_the_cap_get_503_and_the_fd_limit_was_raised(server):
    limits = open(f"/proc/{server.proc.pid}/limits").read()
    soft, hard = next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3:5]
    assert int(soft) == min(65535, int(hard)) > 256  # started with a soft limit of 256
    idle = [_raw(server) for _ in range(12)]
    try:
        time.sleep(0.3)
        assert httpx.get(server.url + "/health", timeout=30).status_code == 503
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while httpx.get(server.url + "/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize("depth", [1000, 100000])
def test_deeply_nested_json_is_a_400_and_the_connection_lives(server, depth):
    with httpx.Client(timeout=60) as client:
        body = '{"prompt": "x", "user": ' + "[" * depth + "]" * depth + "}"
        r = client.post(server.url + "/v1/completions", content=body,
                        headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert client.post(server.url + "/v1/completions", json=OK).status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_declared_json_is_a_400(server, content_type):
    r = _post(server, OK, content_type=content_type)
    assert r.status_code == 400
    assert "application/json" in r.json()["error"]["message"]


def test_an_unknown_model_is_a_404(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="ROMEO:", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_a_subnormal_temperature_is_greedy_served_and_offline(server):
    llm = LLM(num_threads=1)
    greedy = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    tiny = llm.generate("ROMEO:", SamplingParams(temperature=1e-40, max_tokens=12, seed=1),
                        use_tqdm=False)[0]
    assert tiny.outputs[0].token_ids == greedy.outputs[0].token_ids
    r = _post(server, {**OK, "temperature": 1e-40, "max_tokens": 12, "seed": 1})
    assert r.json()["choices"][0]["text"] == greedy.outputs[0].text

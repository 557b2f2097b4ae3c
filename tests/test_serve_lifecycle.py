"""`minirunner serve` as a process: --api-key guards /v1 (401 otherwise), --chat-template serves chat for a
tokenizer without one, and SIGTERM / SIGINT stop it cleanly (exit 0, in-flight streams ended, no child)."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
from serve_helpers import Server  # noqa: E402

MODEL = "shakespeare"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    template = Path(tmp_path_factory.mktemp("tpl")) / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}")
    s = Server("--api-key", "sesame", "--chat-template", str(template), "--served-model-name", "bard")
    yield s
    s.stop()


def test_api_key_is_required_on_v1(keyed):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
        r = httpx.get(keyed.url + "/v1/models", headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(keyed.url + "/health").status_code == 200  # probes need no key
    client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="sesame", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["bard"]
    r = client.chat.completions.create(model="bard", messages=[{"role": "user", "content": "Speak."}],
                                       max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5 and r.choices[0].message.role == "assistant"
    assert 'model_name="bard"' in httpx.get(keyed.url + "/metrics").text


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


@pytest.mark.parametrize("sig, tp", [(signal.SIGTERM, 2), (signal.SIGINT, 1)])
def test_signal_stops_the_server_cleanly_with_a_stream_in_flight(sig, tp):
    """With tensor_parallel_size 2 the server has worker processes: they must go too."""
    server = Server("--shutdown-timeout", "2", "--tensor-parallel-size", str(tp))
    children = _children(server.proc.pid)
    assert len(children) >= (2 if tp > 1 else 0)
    seen: list[str] = []
    started = threading.Event()

    def stream():
        body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 240, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])  # an error event if the shutdown aborted it
                        seen.append(chunk["choices"][0]["text"] if "choices" in chunk else chunk)
                        started.set()
        except httpx.HTTPError:
            pass  # the connection was closed by the stopping server: the stream ended
        finally:
            started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60) and seen
    assert server.stop(sig) == 0
    t.join(60)
    assert not t.is_alive()  # the client was not left hanging
    deadline = time.monotonic() + 30  # a child notices its parent is gone when its pipe closes
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    with pytest.raises(httpx.ConnectError):  # nothing listens any more
        httpx.get(server.url + "/health")

"""`minirunner serve` streams, with the text made outside the engine thread: stop strings that span token
boundaries end each stream exactly where offline `generate` ends it (no token after the stop is reported,
in the chunks, the usage or the metrics), many concurrent streams each equal offline, and a client that
never reads its stream does not hold up anyone else's."""

from __future__ import annotations

import json
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
from serve_helpers import Server  # noqa: E402

from minirunner import LLM, SamplingParams  # noqa: E402

MODEL = "shakespeare"
PROMPTS = ["ROMEO:", "JULIET:", "HAMLET:", "First Citizen:", "KING HENRY:", "Nurse:"]
TOKENS = "vllm:generation_tokens_total"
STOPPED = "vllm:request_success_total[('finished_reason', 'stop')]"


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llm():
    return LLM(num_threads=1)


def spanning_stops(llm, prompts: list[str], seeds: list[int], starts: list[int]) -> list[str]:
    """Per prompt, a stop string from the text offline sampling gives it with its seed: it begins inside
    output token ``start`` and ends inside token ``start + 2``, so no single token's text holds it."""
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=seed, max_tokens=120, ignore_eos=True)
              for seed in seeds]
    outs = llm.generate(prompts, params, use_tqdm=False)
    tok = llm.get_tokenizer()
    stops = []
    for out, start in zip(outs, starts, strict=True):
        ids = out.outputs[0].token_ids
        ends = [len(tok.decode(ids[:i])) for i in range(start + 4)]
        begin, end = ends[start + 1] - 1, ends[start + 2] + 1  # token start's last character ...
        assert ends[start] <= begin < ends[start + 1] < ends[start + 2] < end <= ends[start + 3]
        stops.append(out.outputs[0].text[begin:end])
    return stops


def _requests(llm, count: int) -> list[dict]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
    seeds = [500 + i for i in range(count)]
    stops = spanning_stops(llm, prompts, seeds, [6 + i % 30 for i in range(count)])
    requests = []
    for i in range(count):
        req = dict(prompt=prompts[i], seed=seeds[i], temperature=0.8, top_p=0.95, max_tokens=120,
                   ignore_eos=True, stop=[stops[i]])
        if i % 4 == 1:
            req["include_stop_str_in_output"] = True
        if i % 4 == 2:
            req["stop"] = ["never appears \x01", *req["stop"]]
        requests.append(req)
    return requests


def _offline(llm, requests: list[dict]):
    params = [SamplingParams(**{k: v for k, v in r.items() if k != "prompt"}) for r in requests]
    return llm.generate([r["prompt"] for r in requests], params, use_tqdm=False)


def _body(req: dict) -> tuple[dict, dict]:
    """The openai client's arguments and vLLM's extra fields of one request."""
    extra = {k: req[k] for k in ("ignore_eos", "include_stop_str_in_output") if k in req}
    return {k: v for k, v in req.items() if k not in extra}, extra


def test_concurrent_streams_with_spanning_stop_strings_equal_offline(server, llm):
    requests = _requests(llm, 32)

    async def one(client, req):
        args, extra = _body(req)
        stream = await client.completions.create(model=MODEL, stream=True, extra_body=extra,
                                                 stream_options={"include_usage": True}, **args)
        text, finish, stop, used = "", None, None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
                stop = getattr(chunk.choices[0], "stop_reason", None) or stop
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        return text, finish, stop, used

    before = server.metrics()
    results = server.run_concurrently(one, requests)
    offline = _offline(llm, requests)
    expected = [(o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].stop_reason,
                 len(o.outputs[0].token_ids)) for o in offline]
    assert all(e[1] == "stop" and isinstance(e[2], str) for e in expected)  # every stream met its string
    assert results == expected
    # the engine hears of each stop string at its next step boundary: it finishes the request as stopped
    # (not aborted) and frees its blocks
    deadline = time.monotonic() + 60
    while (m := server.metrics())["vllm:num_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0
    assert m[STOPPED] - before[STOPPED] == len(requests)
    # the tokens the engine produced after a stop string, before it heard of it, are counted nowhere
    assert m[TOKENS] - before[TOKENS] == sum(e[3] for e in expected)


def test_n_completions_and_logprobs_end_at_their_stop_strings_as_offline(server, llm):
    req = dict(prompt="JULIET:", seed=77, temperature=0.8, top_p=0.95, max_tokens=120, ignore_eos=True, n=3,
               logprobs=2, stop=[*spanning_stops(llm, ["JULIET:"], [77], [10]), "\n\n"])
    args, extra = _body(req)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)
    whole = client.completions.create(model=MODEL, extra_body=extra, **args)
    chunks = client.completions.create(model=MODEL, extra_body=extra, stream=True, **args)
    streamed: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    (ref,) = _offline(llm, [req])
    assert whole.usage.completion_tokens == sum(len(c.token_ids) for c in ref.outputs)
    for c in ref.outputs:
        got = whole.choices[c.index]
        assert (got.text, got.finish_reason, got.stop_reason) == (c.text, c.finish_reason, c.stop_reason)
        assert streamed[c.index] == c.text
        # one logprob per token kept, the stop string's last token included, none after it
        assert len(got.logprobs.token_logprobs) == len(c.token_ids)
        assert got.logprobs.token_logprobs == pytest.approx(  # the batch's shape moves the last digits
            [d[t].logprob for t, d in zip(c.token_ids, c.logprobs, strict=True)], rel=1e-4, abs=1e-5)


def test_a_client_that_never_reads_does_not_hold_up_the_others(server, llm):
    # a stream whose chunks are large (20 logprobs each) to a socket with a tiny receive window that is
    # never read: the server's writes to it stall; the other requests must still run to their end
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    stalled.connect(("127.0.0.1", server.port))
    body = json.dumps({"model": MODEL, "prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True,
                       "logprobs": 20, "stream": True, "seed": 3}).encode()
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        requests = [dict(prompt=p, seed=900 + i, temperature=0.8, top_p=0.95, max_tokens=60 + 20 * i,
                         ignore_eos=True) for i, p in enumerate(PROMPTS)]
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
        for req, ref in zip(requests, _offline(llm, requests), strict=True):
            args, extra = _body(req)
            text = "".join(c.choices[0].text for c in
                           client.completions.create(model=MODEL, stream=True, extra_body=extra, **args))
            assert text == ref.outputs[0].text
        # the stalled stream is still open: it has not been given up on, only not read
        stalled.setblocking(False)
        assert stalled.recv(1) == b"H"  # its response began (HTTP/1.1 200)
    finally:
        stalled.close()

"""``minirunner bench serve``'s load and its metrics, as ``vllm bench serve`` measures them.

Owns sending SampleRequests (serve_datasets.py) to a running OpenAI-compatible server, streamed, at Poisson or
gamma arrival times (``burstiness``), to /v1/completions or /v1/chat/completions; timing each from the
client's side (TTFT, inter-token latencies, end-to-end); and the result under vLLM's JSON keys
(``request_throughput``, ``output_throughput``, ``mean_ttft_ms``, ``p99_itl_ms``, ...), with vLLM's goodput
(requests meeting every SLO given). The command line is serve_cli.py's.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
# A chunk with a choice counts as a token arrival (vLLM's client), except the usage chunk (no choice) and
# chat's opening role chunk; the timing loop only looks, and the chunks are parsed once the load is over
# (a light client).
_NO_CHOICE = re.compile(rb'"choices": ?\[\]')


@dataclass
class RequestFuncOutput:
    """One request as the client saw it (vLLM's name): seconds from its send to the first content
    chunk, between later content chunks, and to the end; output tokens from the final usage chunk."""

    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    client_queue_time: float = 0.0  # waiting for a --max-concurrency slot before the send
    generated_text: str = ""
    success: bool = False
    error: str = ""
    chunks: list[bytes] = field(default_factory=list, repr=False)  # parsed by ``parse_chunks``

    def parse_chunks(self) -> None:
        """Text, output tokens (the usage chunk) and an error event, from the chunks kept."""
        for raw in self.chunks:
            chunk = json.loads(raw)
            if chunk.get("usage"):
                self.output_tokens = chunk["usage"]["completion_tokens"]
            if "error" in chunk:
                self.success, self.error = False, str(chunk["error"].get("message"))
            self.generated_text += "".join(_content(c) for c in chunk.get("choices") or ())
        self.chunks = []

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def arrival_times(num: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Seconds after the start at which each request is sent: gaps from a gamma distribution of shape
    ``burstiness`` and mean 1 / ``rate`` (burstiness 1: a Poisson process), seeded, then scaled so the last
    is at num / rate (as vLLM does); rate inf sends them all at once."""
    if math.isinf(rate):
        return [0.0] * num
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), num)
    times = np.cumsum(gaps)
    return (times * (num / rate) / times[-1]).tolist()


def _payload(endpoint: str, model: str, request, ignore_eos: bool, extra: dict) -> dict:
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, **extra}
    if endpoint == "/v1/chat/completions":
        prompt = request.prompt
        body.update(messages=[{"role": "user", "content": prompt}],
                    max_completion_tokens=request.expected_output_len)
    else:
        body.update(prompt=request.prompt, max_tokens=request.expected_output_len)
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def _content(choice: dict) -> str:
    delta = choice.get("delta")
    return (delta.get("content") or "") if delta is not None else (choice.get("text") or "")


async def _one(session, url: str, body: dict, prompt_len: int, headers: dict, bar) -> RequestFuncOutput:
    out = RequestFuncOutput(prompt_len)
    start = last = time.perf_counter()
    out.start_time = start
    try:
        async with session.post(url, json=body, headers=headers) as r:
            if r.status != 200:
                out.error = f"HTTP {r.status}: {(await r.read()).decode()[:200]}"
                return out
            pending = b""
            async for data in r.content.iter_any():  # whatever arrived: one or several events
                now = time.perf_counter()
                *events, pending = (pending + data).split(b"\n\n")
                for event in events:
                    if not event.startswith(b"data: {"):
                        continue
                    out.chunks.append(event[6:])
                    if b'"choices"' not in event or _NO_CHOICE.search(event) or b'"role"' in event:
                        continue
                    if out.ttft == 0.0:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
        out.latency = last - start
        out.success = True
    except Exception as e:  # a failed request is counted, never hidden
        out.error = f"{type(e).__name__}: {e}"
    finally:
        if bar is not None:
            bar.update(1)
    return out


async def run_load(base_url: str, model: str, requests: list, request_rate: float, seed: int = 0,
                   api_key: str | None = None, max_concurrency: int | None = None, use_tqdm: bool = True,
                   endpoint: str = "/v1/completions", burstiness: float = 1.0, ignore_eos: bool = True,
                   extra_body: dict | None = None) -> tuple[list[RequestFuncOutput], float]:
    """Send every request at its arrival time; (outputs, seconds from the first send to the last
    response). The client is aiohttp's (as vLLM's bench): on a host whose cores the server shares, a
    cheaper client leaves the server more of them."""
    import aiohttp
    from tqdm.auto import tqdm

    if endpoint not in ENDPOINTS:
        raise ValueError(f"--endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency or len(requests))
    bar = tqdm(total=len(requests), desc=f"bench serve @ {request_rate:g} req/s", disable=not use_tqdm)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=6 * 3600),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()

        async def send(request, at: float) -> RequestFuncOutput:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            arrived = time.perf_counter()
            async with limit:
                body = _payload(endpoint, model, request, ignore_eos, extra_body or {})
                out = await _one(session, base_url + endpoint, body, request.prompt_len, headers, bar)
            out.client_queue_time = out.start_time - arrived
            return out

        times = arrival_times(len(requests), request_rate, seed, burstiness)
        outputs = await asyncio.gather(*[send(r, at) for r, at in zip(requests, times, strict=True)])
        duration = time.perf_counter() - t0
    bar.close()
    for out in outputs:
        out.parse_chunks()
    return list(outputs), duration


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``--goodput ttft:500 tpot:50`` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds, vLLM's form)."""
    slos = {}
    for item in items or ():
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise ValueError(f"--goodput takes KEY:MS with KEY ttft, tpot or e2el, got {item!r}")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if slos[name] < 0:
            raise ValueError(f"--goodput {item!r}: the SLO must not be negative")
    return slos


def calculate_metrics(outputs: list[RequestFuncOutput], duration: float,
                      percentile_metrics=("ttft", "tpot", "itl"), percentiles=(99.0,),
                      goodput: dict[str, float] | None = None) -> dict:
    """vLLM's result keys: counts, throughputs, goodput (None without SLOs), and for each metric of
    ``percentile_metrics`` its mean / median / std and each percentile, in milliseconds."""
    ok = [o for o in outputs if o.success]
    out_lens = [o.output_tokens if o.success else 0 for o in outputs]
    values = {"ttft": [o.ttft for o in ok], "tpot": [o.tpot for o in ok if o.tpot is not None],
              "itl": [g for o in ok for g in o.itl], "e2el": [o.latency for o in ok]}
    good = 0
    if goodput:
        for o in ok:
            got = {"ttft": o.ttft, "tpot": o.tpot or 0.0, "e2el": o.latency}
            good += all(got[k] <= ms / 1e3 for k, ms in goodput.items())
    total_in = sum(o.prompt_len for o in ok)
    result = dict(duration=duration, completed=len(ok), failed=len(outputs) - len(ok),
                  total_input_tokens=total_in, total_output_tokens=sum(out_lens),
                  request_throughput=len(ok) / duration, request_goodput=good / duration if goodput else None,
                  output_throughput=sum(out_lens) / duration,
                  total_token_throughput=(total_in + sum(out_lens)) / duration,
                  max_output_tokens_per_s=_peak_tokens_per_s(ok),
                  max_concurrent_requests=_peak_concurrency(ok))
    for name in percentile_metrics:
        if name not in METRICS:
            raise ValueError(f"--percentile-metrics takes {METRICS}, got {name!r}")
        a = np.asarray(values[name] or [0.0]) * 1e3
        result.update({f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
                       f"std_{name}_ms": float(a.std())})
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            result[f"p{word}_{name}_ms"] = float(np.percentile(a, p))
    result.update(input_lens=[o.prompt_len for o in outputs], output_lens=out_lens,
                  ttfts=[o.ttft for o in outputs], itls=[o.itl for o in outputs],
                  latencies=[o.latency for o in outputs], start_times=[o.start_time for o in outputs],
                  queue_times=[o.client_queue_time for o in outputs],
                  generated_texts=[o.generated_text for o in outputs], errors=[o.error for o in outputs],
                  rtfx=0.0)  # vLLM's inverse real-time factor, for speech input only
    return result


def _peak_tokens_per_s(ok: list[RequestFuncOutput]) -> float:
    if not ok:
        return 0.0
    t0 = min(o.start_time for o in ok)
    buckets: dict[int, int] = {}
    for o in ok:
        t = o.start_time + o.ttft
        for gap in [0.0, *o.itl]:
            t += gap
            buckets[int(t - t0)] = buckets.get(int(t - t0), 0) + 1
    return float(max(buckets.values()))


def _peak_concurrency(ok: list[RequestFuncOutput]) -> int:
    events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok])
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak

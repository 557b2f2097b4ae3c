"""``minirunner bench serve``: a load generator for a running OpenAI-compatible server (vLLM's
``vllm bench serve``): seeded prompts from the bench's workloads, sent at Poisson arrival times.

Owns timing each streamed request from the client's side (TTFT, TPOT, inter-token latency, end-to-end),
their percentiles, output throughput and goodput under an SLO, the JSON and the one-screen summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from minirunner.tools.bench.workloads import WORKLOADS, Workload, make_workload


@dataclass
class RequestTiming:
    """One request as the client saw it (seconds from its send): first chunk, every later chunk gap."""

    prompt_tokens: int
    output_tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def arrival_times(num: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent: a Poisson process of ``rate`` requests per
    second (exponential gaps, seeded); rate inf sends them all at once."""
    if math.isinf(rate):
        return [0.0] * num
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num)
    return np.cumsum(gaps).tolist()


async def _one(session, url: str, model: str, prompt: list[int], max_tokens: int, headers: dict,
               bar) -> RequestTiming:
    timing = RequestTiming(len(prompt))
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = last = time.perf_counter()
    try:
        async with session.post(f"{url}/v1/completions", json=body, headers=headers) as r:
            if r.status != 200:
                timing.error = f"HTTP {r.status}: {(await r.read()).decode()[:200]}"
                return timing
            pending = b""
            async for data in r.content.iter_any():  # whatever arrived: one or several events
                now = time.perf_counter()
                *events, pending = (pending + data).split(b"\n\n")
                for event in events:
                    if not event.startswith(b"data: {"):
                        continue
                    if b'"choices": []' in event:  # the usage chunk: the only one parsed (a light client)
                        timing.output_tokens = json.loads(event[6:])["usage"]["completion_tokens"]
                        continue
                    if timing.ttft is None:
                        timing.ttft = now - start
                    else:
                        timing.itl.append(now - last)
                    last = now
        timing.e2e = time.perf_counter() - start
    except Exception as e:  # a failed request is counted, never hidden
        timing.error = f"{type(e).__name__}: {e}"
    finally:
        if bar is not None:
            bar.update(1)
    return timing


async def run_load(url: str, model: str, workload: Workload, request_rate: float, seed: int = 0,
                   api_key: str | None = None, max_concurrency: int | None = None,
                   use_tqdm: bool = True) -> tuple[list[RequestTiming], float]:
    """Send every request of ``workload`` at its Poisson arrival time; (timings, seconds from the first
    send to the last response). The client is aiohttp's (as vLLM's bench): on a host whose cores the
    server shares, a cheaper client leaves the server more of them."""
    import aiohttp
    from tqdm.auto import tqdm

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency or len(workload))
    bar = tqdm(total=len(workload), desc=f"bench serve @ {request_rate:g} req/s", disable=not use_tqdm)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()

        async def send(i: int, at: float) -> RequestTiming:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            async with limit:
                return await _one(session, url, model, workload.prompts[i], workload.max_tokens[i],
                                  headers, bar)

        times = arrival_times(len(workload), request_rate, seed)
        timings = await asyncio.gather(*[send(i, at) for i, at in enumerate(times)])
        duration = time.perf_counter() - t0
    bar.close()
    return list(timings), duration


def _stats(values: list[float]) -> dict:
    if not values:
        return dict(mean=None, p50=None, p90=None, p99=None)
    a = np.asarray(values)
    return dict(mean=float(a.mean()), p50=float(np.percentile(a, 50)), p90=float(np.percentile(a, 90)),
                p99=float(np.percentile(a, 99)))


def summarize(timings: list[RequestTiming], duration: float, slo_ttft: float, slo_tpot: float) -> dict:
    """Percentiles (seconds), throughput and goodput: requests per second that met both SLOs (TTFT at most
    ``slo_ttft``, TPOT at most ``slo_tpot``; vLLM's definition)."""
    ok = [t for t in timings if t.error is None]
    good = [t for t in ok if t.ttft <= slo_ttft and (t.tpot is None or t.tpot <= slo_tpot)]
    out_tokens = sum(t.output_tokens for t in ok)
    return dict(
        completed=len(ok), failed=len(timings) - len(ok), duration_s=duration,
        prompt_tokens=sum(t.prompt_tokens for t in ok), output_tokens=out_tokens,
        request_throughput=len(ok) / duration, output_tok_per_s=out_tokens / duration,
        goodput=len(good) / duration, slo=dict(ttft_s=slo_ttft, tpot_s=slo_tpot),
        ttft_s=_stats([t.ttft for t in ok]), tpot_s=_stats([t.tpot for t in ok if t.tpot is not None]),
        itl_s=_stats([g for t in ok for g in t.itl]), e2e_s=_stats([t.e2e for t in ok]),
        errors=sorted({t.error for t in timings if t.error})[:5])


def format_summary(report: dict) -> str:
    s = report["summary"]
    lines = [f"bench serve: {report['url']}  model {report['model']}  {report['workload']['description']}",
             f"request rate {report['request_rate']} req/s (Poisson, seed {report['seed']})",
             f"completed {s['completed']}  failed {s['failed']}  in {s['duration_s']:.2f} s",
             f"output tok/s {s['output_tok_per_s']:.1f}  requests/s {s['request_throughput']:.2f}  "
             f"goodput {s['goodput']:.2f} req/s (TTFT <= {s['slo']['ttft_s'] * 1e3:g} ms, "
             f"TPOT <= {s['slo']['tpot_s'] * 1e3:g} ms)",
             f"{'ms':<6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}"]
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        row = s[key]
        lines.append(f"{name:<6}" + "".join("{:>10}".format("-" if row[q] is None else f"{row[q] * 1e3:.1f}")
                                            for q in ("mean", "p50", "p90", "p99")))
    for e in s["errors"]:
        lines.append(f"error: {e}")
    return "\n".join(lines)


def add_bench_serve_parser(bench: argparse.ArgumentParser) -> None:
    sub = bench.add_subparsers(dest="bench_command", required=False, metavar="{serve}")
    p = sub.add_parser("serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="load a running server (`minirunner serve`) with Poisson arrivals",
                       description="Send a seeded workload to a running OpenAI-compatible server at Poisson "
                                   "arrival times (streamed, greedy, EOS ignored); print TTFT, TPOT, ITL "
                                   "and end-to-end p50/p90/p99, output tok/s and goodput.")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--model", default=None, help="served model name (default: the server's first)")
    p.add_argument("--model-dir", default=None,
                   help="the model's directory, for its vocabulary and tokenizer (default: embedded)")
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests per second (inf: all "
                   "at once)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--workload", default="nano", choices=WORKLOADS)
    p.add_argument("--input-len", type=int, nargs=2, default=[8, 96], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 160], metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0, help="seeds the workload and the arrival times")
    p.add_argument("--slo-ttft-ms", type=float, default=500.0, help="goodput's TTFT bound")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0, help="goodput's TPOT bound")
    p.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    p.add_argument("--json", default=None, help="write the report as JSON here")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(handler=run_bench_serve)


def run_bench_serve(args) -> int:
    import httpx

    from minirunner.assets import default_model_dir
    from minirunner.config import ModelConfig
    from minirunner.tokenizer import load_tokenizer

    if args.num_prompts < 1 or not args.request_rate > 0:
        print("error: --num-prompts must be >= 1 and --request-rate > 0", file=sys.stderr)
        return 2
    url = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        models = httpx.get(f"{url}/v1/models", headers=headers, timeout=30).raise_for_status().json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as e:
        print(f"error: could not list the models at {url}/v1/models: {e}", file=sys.stderr)
        return 2
    served = next((m for m in models if args.model in (None, m["id"])), None)
    if served is None:
        names = [m["id"] for m in models]
        print(f"error: the server does not serve {args.model!r}; it serves {names}", file=sys.stderr)
        return 2
    model_dir = args.model_dir or default_model_dir()
    mc = ModelConfig.from_dir(model_dir)
    max_len = served.get("max_model_len") or mc.max_position_embeddings
    tokenizer = load_tokenizer(model_dir) if args.workload in ("text", "repetitive") else None
    wl = make_workload(args.workload, args.num_prompts, mc.vocab_size, max_len, args.seed,
                       tuple(args.input_len), tuple(args.output_len), tokenizer=tokenizer)
    timings, duration = asyncio.run(run_load(url, served["id"], wl, args.request_rate, args.seed,
                                             args.api_key, args.max_concurrency, not args.no_progress))
    report = dict(url=url, model=served["id"], request_rate=_rate(args.request_rate), seed=args.seed,
                  max_concurrency=args.max_concurrency,
                  workload=dict(name=wl.name, description=wl.description, num_requests=len(wl),
                                prompt_tokens=wl.num_prompt_tokens, output_tokens=wl.num_output_tokens),
                  summary=summarize(timings, duration, args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3),
                  requests=[asdict(t) | {"tpot": t.tpot} for t in timings])
    print(format_summary(report))
    if args.json:
        from pathlib import Path

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0 if report["summary"]["failed"] == 0 else 1


def _rate(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate  # JSON has no infinity

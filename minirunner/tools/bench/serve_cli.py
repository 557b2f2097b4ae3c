"""``minirunner bench serve``'s command line: ``vllm bench serve``'s common flags, and its result JSON.

Owns parsing the flags (vLLM's names: --dataset-name, --dataset-path, --endpoint, --request-rate,
--burstiness, --percentile-metrics, --metric-percentiles, --goodput, --save-result, ...), building the
requests (serve_datasets.py), running the load (serve.py), the one-screen summary and the saved result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from datetime import datetime
from pathlib import Path

from minirunner.tools.bench.serve import ENDPOINTS, calculate_metrics, parse_goodput, run_load
from minirunner.tools.bench.serve_datasets import (
    DATASETS,
    custom_requests,
    random_requests,
    sharegpt_requests,
)


def add_bench_serve_parser(bench: argparse.ArgumentParser) -> None:
    sub = bench.add_subparsers(dest="bench_command", required=False, metavar="{serve}")
    p = sub.add_parser("serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="load a running server (`minirunner serve`, or any OpenAI-compatible one)",
                       description="vLLM's `vllm bench serve`: send a dataset's prompts to a running "
                                   "OpenAI-compatible server, streamed, at Poisson or gamma arrival times; "
                                   "print and save TTFT, TPOT, ITL and E2EL statistics, throughputs and "
                                   "goodput under vLLM's result keys.")
    p.add_argument("--base-url", "--url", dest="base_url", default=None,
                   help="the server's base URL (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    p.add_argument("--backend", default=None, choices=["vllm", "openai", "openai-chat"],
                   help="accepted for vLLM's command lines; openai-chat implies the chat endpoint")
    p.add_argument("--model", default=None, help="served model name (default: the server's first)")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer directory for prompt lengths (default: the embedded model's)")
    p.add_argument("--dataset-name", default="random", choices=DATASETS)
    p.add_argument("--dataset-path", default=None, help="a local ShareGPT JSON or custom JSONL file")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--random-input-len", "--input-len", dest="random_input_len", type=int, default=1024)
    p.add_argument("--random-output-len", "--output-len", dest="random_output_len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--random-prefix-len", type=int, default=0)
    p.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="ask every ShareGPT request for this many tokens (default: the reply's length)")
    p.add_argument("--custom-output-len", type=int, default=256)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests per second (inf: all "
                   "at once)")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="the gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more even")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--seed", type=int, default=0, help="seeds the dataset sample and the arrival times")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (every request runs to "
                   "its max_tokens)")
    p.add_argument("--temperature", type=float, default=None, help="sent when given (else the server's "
                   "default)")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="comma-separated, from ttft, tpot, itl, e2el")
    p.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles, e.g. 50,90,99")
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el)")
    p.add_argument("--label", default=None, help="the result's label (default: the endpoint type)")
    p.add_argument("--save-result", action="store_true", help="write the result JSON")
    p.add_argument("--result-dir", default=".", help="where --save-result writes")
    p.add_argument("--result-filename", default=None, help="the file --save-result writes")
    p.add_argument("--api-key", default=None, help="the server's key (default: $OPENAI_API_KEY)")
    p.add_argument("--disable-tqdm", "--no-progress", dest="disable_tqdm", action="store_true")
    p.set_defaults(handler=run_bench_serve)


def _requests(args, tokenizer, vocab_size: int, max_len: int, endpoint: str) -> list:
    if args.dataset_name == "random":  # token ids to completions (exact lengths), text to chat
        return random_requests(tokenizer, args.num_prompts, args.random_input_len,
                               args.random_output_len, args.random_range_ratio, args.random_prefix_len,
                               vocab_size, max_len, args.seed, as_text=endpoint.endswith("chat/completions"))
    if args.dataset_path is None:
        raise ValueError(f"--dataset-name {args.dataset_name} needs --dataset-path (a local file)")
    if tokenizer is None:
        raise ValueError("text datasets need a tokenizer to count prompt tokens: pass --tokenizer DIR")
    if args.dataset_name == "sharegpt":
        return sharegpt_requests(args.dataset_path, tokenizer, args.num_prompts, max_len, args.seed,
                                 args.sharegpt_output_len)
    return custom_requests(args.dataset_path, tokenizer, args.num_prompts, max_len, args.seed,
                           args.custom_output_len)


def format_summary(result: dict, metrics: list[str], percentiles: list[float]) -> str:
    rows = [("Successful requests:", result["completed"]), ("Failed requests:", result["failed"]),
            ("Benchmark duration (s):", f"{result['duration']:.2f}"),
            ("Total input tokens:", result["total_input_tokens"]),
            ("Total generated tokens:", result["total_output_tokens"]),
            ("Request throughput (req/s):", f"{result['request_throughput']:.2f}")]
    if result["request_goodput"] is not None:
        rows.append(("Request goodput (req/s):", f"{result['request_goodput']:.2f}"))
    rows += [("Output token throughput (tok/s):", f"{result['output_throughput']:.2f}"),
             ("Total token throughput (tok/s):", f"{result['total_token_throughput']:.2f}")]
    lines = ["{:=^50}".format(" Serving Benchmark Result ")] + [f"{k:<40} {v:<10}" for k, v in rows]
    for m in metrics:
        lines.append("{:-^50}".format(f" {m.upper()} "))
        lines.append(f"{'Mean ' + m.upper() + ' (ms):':<40} {result[f'mean_{m}_ms']:<10.2f}")
        lines.append(f"{'Median ' + m.upper() + ' (ms):':<40} {result[f'median_{m}_ms']:<10.2f}")
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            lines.append(f"{'P' + word + ' ' + m.upper() + ' (ms):':<40} {result[f'p{word}_{m}_ms']:<10.2f}")
    lines.append("=" * 50)
    lines += [f"error: {e}" for e in sorted({e for e in result["errors"] if e})[:5]]
    return "\n".join(lines)


def run_bench_serve(args) -> int:
    import httpx

    from minirunner.assets import default_model_dir
    from minirunner.config import ModelConfig
    from minirunner.tokenizer import load_tokenizer

    if args.num_prompts < 1 or not args.request_rate > 0:
        print("error: --num-prompts must be >= 1 and --request-rate > 0", file=sys.stderr)
        return 2
    endpoint = "/v1/chat/completions" if args.backend == "openai-chat" else args.endpoint
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    from minirunner import envs

    api_key = args.api_key or envs.OPENAI_API_KEY
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30)
        models = r.raise_for_status().json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as e:
        print(f"error: could not list the models at {base_url}/v1/models: {e}", file=sys.stderr)
        return 2
    served = next((m for m in models if args.model in (None, m["id"])), None)
    if served is None:
        print(f"error: the server does not serve {args.model!r}; it serves {[m['id'] for m in models]}",
              file=sys.stderr)
        return 2
    tokenizer_dir = args.tokenizer or default_model_dir()
    try:
        metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
        goodput = parse_goodput(args.goodput)
        tokenizer = load_tokenizer(tokenizer_dir)
        try:
            vocab = ModelConfig.from_dir(tokenizer_dir).vocab_size
        except (ValueError, OSError):  # a tokenizer directory without a model config
            vocab = len(tokenizer)
        max_len = served.get("max_model_len") or 2048
        requests = _requests(args, tokenizer, vocab, max_len, endpoint)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    extra = {} if args.temperature is None else {"temperature": args.temperature}
    outputs, duration = asyncio.run(run_load(
        base_url, served["id"], requests, args.request_rate, args.seed, api_key, args.max_concurrency,
        not args.disable_tqdm, endpoint, args.burstiness, args.ignore_eos, extra))
    try:
        stats = calculate_metrics(outputs, duration, metrics, percentiles, goodput)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    backend = "openai-chat" if endpoint.endswith("chat/completions") else "openai"
    result = dict(date=datetime.now().strftime("%Y%m%d-%H%M%S"), endpoint_type=backend, backend=backend,
                  label=args.label or backend, model_id=served["id"], tokenizer_id=str(tokenizer_dir),
                  num_prompts=args.num_prompts,
                  request_rate=args.request_rate if not math.isinf(args.request_rate) else "inf",
                  burstiness=args.burstiness, max_concurrency=args.max_concurrency, **stats)
    print(format_summary(result, metrics, percentiles))
    if args.save_result:
        name = args.result_filename or (f"{backend}-{args.request_rate}qps-{served['id']}-"
                                        f"{result['date']}.json")
        path = Path(args.result_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result) + "\n")
        print(f"result written to {path}")
    return 0 if result["failed"] == 0 else 1

"""Serving latency against request rate, and the server's saturated throughput against offline generate.

Starts ``minirunner serve`` (a subprocess on a free loopback port), loads it with ``bench serve``'s client at
each request rate (Poisson arrivals, the nano workload), and at saturation (every request at once)
alternates server and offline ``LLM.generate`` runs on the same prompts, ``--pairs`` times. Writes
``serve_rate_<r>.json`` per rate, ``serve_vs_offline.json`` and ``serve_latency_vs_rate.png``. Usage:
    python benchmarks/serve_latency.py [--rates 4 12 24] [--num-prompts 64] [--pairs 3]
Each pair also records CPU seconds (server process, load client, offline) and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from minirunner import LLM, SamplingParams
from minirunner.tools.bench import environment, make_workload
from minirunner.tools.bench.serve import calculate_metrics, run_load
from minirunner.tools.bench.serve_datasets import from_workload

PERCENTILES = (50.0, 99.0)
GREEDY = {"temperature": 0.0}  # as the offline side samples


def summarize(outputs, duration: float, slo_ttft_ms: float, slo_tpot_ms: float) -> dict:
    """bench serve's result (vLLM's keys), p50 and p99, goodput under the SLOs; no per-request lists."""
    s = calculate_metrics(outputs, duration, ("ttft", "tpot", "itl", "e2el"), PERCENTILES,
                          {"ttft": slo_ttft_ms, "tpot": slo_tpot_ms})
    return {k: v for k, v in s.items() if not isinstance(v, list)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (every thread), from /proc (Linux)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(threads: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minirunner", "serve", "--port", str(port),
                             "--num-threads", threads, "--uvicorn-log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="*", default=[4.0, 12.0, 24.0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3, help="alternating server / offline saturated runs")
    parser.add_argument("--num-threads", default="1", help="torch threads, server and offline alike")
    parser.add_argument("--slo-ttft-ms", type=float, default=500.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=100.0)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = args.num_threads
    llm = LLM(num_threads=int(threads) if threads != "auto" else "auto")
    mc, max_len = llm.engine.model_config, llm.engine.config.max_model_len
    wl = make_workload("nano", args.num_prompts, mc.vocab_size, max_len, 0, (8, 96), (16, 160))
    warm = make_workload("fixed", 4, mc.vocab_size, max_len, 1, (8, 8), (8, 8))
    slo = (args.slo_ttft_ms, args.slo_tpot_ms)
    requests, warm_requests = from_workload(wl), from_workload(warm)
    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=m) for m in wl.max_tokens]
    llm.generate(warm.prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    proc, url = start_server(threads)
    try:
        asyncio.run(run_load(url, "shakespeare", warm_requests, math.inf, use_tqdm=False,
                             extra_body=GREEDY))
        by_rate = []
        for rate in args.rates:
            timings, duration = asyncio.run(run_load(url, "shakespeare", requests, rate, seed=0,
                                                     use_tqdm=False, extra_body=GREEDY))
            s = summarize(timings, duration, *slo)
            report = dict(request_rate=rate, workload=wl.description, environment=environment(),
                          num_threads=threads, summary=s)
            (out / f"serve_rate_{rate:g}.json").write_text(json.dumps(report, indent=1) + "\n")
            by_rate.append(report)
            print(f"rate {rate:g}: {s['output_throughput']:.1f} tok/s, TTFT p50 {s['p50_ttft_ms']:.0f} "
                  f"ms p99 {s['p99_ttft_ms']:.0f} ms, TPOT p50 {s['p50_tpot_ms']:.1f} ms, "
                  f"goodput {s['request_goodput']:.2f} req/s")
        pairs = []
        for i in range(args.pairs):  # alternate, so a busy minute on the shared host hits both sides
            cpu0, client0 = process_cpu_s(proc.pid), time.process_time()
            timings, duration = asyncio.run(run_load(url, "shakespeare", requests, math.inf,
                                                     use_tqdm=False, extra_body=GREEDY))
            server_cpu, client_cpu = process_cpu_s(proc.pid) - cpu0, time.process_time() - client0
            served = summarize(timings, duration, *slo)
            t0, cpu0 = time.perf_counter(), time.process_time()
            outs = llm.generate(wl.prompts, params, use_tqdm=False)
            offline_s, offline_cpu = time.perf_counter() - t0, time.process_time() - cpu0
            offline = sum(len(o.outputs[0].token_ids) for o in outs) / offline_s
            pairs.append(dict(server_output_tok_per_s=served["output_throughput"],
                              offline_output_tok_per_s=offline,
                              ratio=served["output_throughput"] / offline,
                              # CPU seconds offline / CPU seconds server and client together: the wall
                              # ratio a host with no idle core gives (a busy shared host blurs the wall)
                              cpu_ratio=offline_cpu / (server_cpu + client_cpu),
                              load_average_1min=os.getloadavg()[0],
                              server_wall_s=duration, server_cpu_s=server_cpu, client_cpu_s=client_cpu,
                              offline_wall_s=offline_s, offline_cpu_s=offline_cpu,
                              server_summary=served))
            print(f"pair {i}: server {served['output_throughput']:.1f} tok/s ({duration:.1f} s wall, "
                  f"{server_cpu:.1f} s CPU), offline {offline:.1f} tok/s ({offline_s:.1f} s wall, "
                  f"{offline_cpu:.1f} s CPU), ratio {pairs[-1]['ratio']:.3f}, load {os.getloadavg()[0]:.1f}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    ratios, cpu_ratios = [p["ratio"] for p in pairs], [p["cpu_ratio"] for p in pairs]
    saturated = dict(workload=wl.description, num_threads=threads, environment=environment(), pairs=pairs,
                     ratio_median=float(np.median(ratios)), ratio_min=min(ratios), ratio_max=max(ratios),
                     cpu_ratio_median=float(np.median(cpu_ratios)), cpu_ratio_min=min(cpu_ratios),
                     cpu_ratio_max=max(cpu_ratios))
    (out / "serve_vs_offline.json").write_text(json.dumps(saturated, indent=1) + "\n")
    print(f"server / offline output tok/s at saturation: median {saturated['ratio_median']:.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} alternating pairs; CPU seconds "
          f"offline / (server + client): median {saturated['cpu_ratio_median']:.3f} "
          f"(min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f})")
    if by_rate:
        plot(by_rate, pairs, out / "serve_latency_vs_rate.png")


def plot(by_rate: list[dict], pairs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r["request_rate"] for r in by_rate]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "end-to-end")):
        for q, style in (("p50", "-o"), ("p99", "--x")):
            ax1.plot(rates, [r["summary"][f"{q}_{key}_ms"] for r in by_rate], style, label=f"{name} {q}")
    ax1.set_yscale("log")
    ax1.set_xlabel("request rate (req/s, Poisson)")
    ax1.set_ylabel("ms")
    ax1.legend(fontsize=7)
    ax1.set_title("latency against request rate", fontsize=9)
    ax2.plot(rates, [r["summary"]["output_throughput"] for r in by_rate], "-o", label="server")
    med = float(np.median([p["offline_output_tok_per_s"] for p in pairs]))
    sat = float(np.median([p["server_output_tok_per_s"] for p in pairs]))
    ax2.axhline(med, color="gray", ls="--", label=f"offline generate, all at once ({med:.0f})")
    ax2.axhline(sat, color="C1", ls=":", label=f"server, all at once ({sat:.0f})")
    ax2.set_xlabel("request rate (req/s, Poisson)")
    ax2.set_ylabel("output tok/s")
    ax2.legend(fontsize=7)
    ax2.set_title("throughput", fontsize=9)
    fig.suptitle(f"minirunner serve, embedded model, CPU (shared host): {by_rate[0]['workload']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()

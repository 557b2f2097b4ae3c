"""Head-of-line blocking by oversized prompts: while four 1 MB prompts are being refused, how long /health
takes and how long a running stream waits between chunks.

Starts ``minirunner serve`` (a subprocess on a free loopback port), opens one long greedy stream, and once it
has begun sends four 1 MB text prompts at once while polling /health every 20 ms. Reports the slowest
/health answer, the longest gap between the stream's chunks during the window and outside it, and how long
the 1 MB requests took to get their 400. Writes ``serve_big_prompts.json``. Usage:
    python benchmarks/serve_big_prompts.py [--out benchmarks/results] [--runs 3]
A timing on a shared machine: the note records the 1-minute load average with each run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serve_helpers import Server  # noqa: E402

BIG = "ROMEO: But soft. " * 61681  # 1 MB of text (1,048,577 characters)


def one_run(server: Server) -> dict:
    gaps: list[tuple[float, float]] = []  # (when, gap)
    started = threading.Event()

    def stream():
        body = {"prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True, "stream": True, "temperature": 0}
        last = None
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                now = time.perf_counter()
                if line.startswith("data: {"):
                    if last is not None:
                        gaps.append((now, now - last))
                    last = now
                    started.set()

    refusals: list[tuple[int, float]] = []

    def big():
        t0 = time.perf_counter()
        r = httpx.post(server.url + "/v1/completions", json={"prompt": BIG, "max_tokens": 4}, timeout=120)
        refusals.append((r.status_code, time.perf_counter() - t0))

    s = threading.Thread(target=stream)
    s.start()
    started.wait(60)
    time.sleep(0.2)
    window0 = time.perf_counter()
    bigs = [threading.Thread(target=big) for _ in range(4)]
    for t in bigs:
        t.start()
    health = []
    with httpx.Client(timeout=30) as client:
        while any(t.is_alive() for t in bigs):
            t0 = time.perf_counter()
            client.get(server.url + "/health")
            health.append(time.perf_counter() - t0)
            time.sleep(0.02)
    window1 = time.perf_counter()
    for t in bigs:
        t.join()
    s.join()
    inside = [g for when, g in gaps if window0 <= when <= window1 + 0.75]
    outside = [g for when, g in gaps if not window0 <= when <= window1 + 0.75]
    return dict(refusal_status=sorted(c for c, _ in refusals), refusal_s_max=max(t for _, t in refusals),
                window_s=window1 - window0, health_max_s=max(health), health_polls=len(health),
                stream_gap_max_in_window_s=max(inside, default=None),
                stream_gap_max_outside_s=max(outside, default=None), load_average_1min=os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    server = Server()
    try:
        runs = []
        for i in range(args.runs):
            runs.append(one_run(server))
            print(f"run {i}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in runs[-1].items()))
    finally:
        server.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_big_prompts.json").write_text(json.dumps({"runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()

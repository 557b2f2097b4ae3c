"""A live `minirunner serve` for the serve tests: a real subprocess on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from minirunner.tools.serve_lab import free_port

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """``python -m minirunner serve`` with ``args``, started and ready (GET /health is 200)."""

    def __init__(self, *args: str, ready_timeout: float = 180.0, env: dict | None = None,
                 preexec_fn=None):
        """``env``: extra environment variables; ``preexec_fn``: run in the child before it starts."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, **(env or {}),
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minirunner", "serve", "--port", str(self.port), "--num-threads", "1",
             "--uvicorn-log-level", "warning", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=preexec_fn)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.proc.stdout.read()
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the server did not become ready")

    def metrics(self) -> dict[str, float]:
        """The /metrics samples, {'name{labels}': value}, parsed with prometheus_client's own parser."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name"))
                out[s.name + (str(labels) if labels else "")] = s.value
        return out

    def run_concurrently(self, one, requests: list) -> list:
        """``await one(client, request)`` for every request at once, with one ``openai.AsyncOpenAI``
        client; the results in order."""
        import asyncio

        import openai

        async def run_all():
            client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="x", max_retries=0, timeout=300)
            try:
                return await asyncio.gather(*[one(client, r) for r in requests])
            finally:
                await client.close()

        return asyncio.run(run_all())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

"""A live server for a notebook or a script, and the one adapter to ``minirunner bench serve`` (notebook 09).

Owns ``ServerProcess`` (``python -m minirunner serve`` on a free 127.0.0.1 port, ready when GET /health
answers, stopped on leaving its ``with`` block, on error and at interpreter exit) and ``bench_serve``, the
only place the course runs the load generator: it calls the command line, reads its JSON and returns
per-request timings (``LoadRun``). A load generator with another JSON schema (vLLM's ``vllm bench serve``)
needs a change here alone. Standard library only: it runs the runner as a subprocess, never in-process.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from minirunner import envs

__all__ = ["ServerProcess", "LoadRun", "RequestRecord", "bench_serve", "children_cpu_s", "free_port",
           "process_cpu_s"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (every thread) from /proc; None where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float | None:
    """User + system CPU seconds of this process's finished children (a ``bench serve`` run); None where
    the platform has no ``resource`` module (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ServerProcess:
    """``minirunner serve`` with ``args`` (its flags, e.g. ``"--max-num-seqs", "4"``) as a subprocess on
    127.0.0.1. Use it as a context manager; ``stop()`` is also registered with ``atexit``, so a kernel
    that is shut down or restarted does not leave a server behind. The server's log goes to a temporary
    file (``log()`` reads it), so a full pipe never blocks it."""

    def __init__(self, *args: str, num_threads: int = 1, ready_timeout: float = 300.0):
        self.args, self.num_threads, self.ready_timeout = list(args), num_threads, ready_timeout
        self.port: int | None = None
        self.url: str | None = None
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> ServerProcess:
        if self.proc is not None:
            raise RuntimeError("this server is already started")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile(mode="w+")
        root = str(Path(__file__).resolve().parents[2])
        env = envs.for_child(root)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minirunner", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--num-threads", str(self.num_threads), "--uvicorn-log-level", "warning", *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        atexit.register(self.stop)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log()
                self.stop()
                raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{log[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {self.ready_timeout:.0f} s")

    def log(self) -> str:
        if self._log is None or self._log.closed:
            return ""
        self._log.seek(0)
        return self._log.read()

    def cpu_s(self) -> float | None:
        """The server process's CPU seconds so far (Linux); None elsewhere or when stopped."""
        return None if self.proc is None or self.proc.poll() is not None else process_cpu_s(self.proc.pid)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the server drains for its --shutdown-timeout), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        atexit.unregister(self.stop)
        if self._log is not None and not self._log.closed:
            self._log.close()
        return self.proc.returncode

    @contextmanager
    def guard(self):
        """Stop the server if the block raises (a notebook cell that fails does not leave it running)."""
        try:
            yield self
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class RequestRecord:
    """One request as the load generator saw it, in seconds from its send: ``ttft``, ``itl`` (every gap
    between later chunks), ``e2e``; ``error`` is None for a completed request."""

    prompt_tokens: int
    output_tokens: int
    ttft: float | None
    itl: list[float]
    e2e: float | None
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        """(e2e - ttft) / (output tokens - 1), vLLM's TPOT; None below two tokens or for a failure."""
        if self.error is not None or self.output_tokens < 2 or self.ttft is None or self.e2e is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass
class LoadRun:
    """One ``bench serve`` run: the offered rate, the run's duration (first send to last response), the
    requests, and the load generator's own summary figures (``goodput``: requests per second that met
    both SLOs; ``request_throughput``; ``output_throughput``: tokens per second)."""

    request_rate: float
    duration: float
    requests: list[RequestRecord]
    goodput: float
    request_throughput: float
    output_throughput: float
    slo_ttft: float
    slo_tpot: float
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def completed(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.error is None]


def bench_serve(url: str, *, request_rate: float, num_prompts: int, input_len: int, output_len: int,
                seed: int = 0, slo_ttft: float = 0.5, slo_tpot: float = 0.1, timeout: float = 600.0
                ) -> LoadRun:
    """Run ``minirunner bench serve`` against ``url``: ``num_prompts`` requests of ``input_len`` random
    prompt tokens and ``output_len`` tokens out (greedy, EOS ignored), sent at Poisson arrivals of
    ``request_rate`` per second (inf: all at once), seeded. SLOs in seconds. The course's only adapter to
    the load generator: its command line and its JSON are read here and nowhere else."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "minirunner", "bench", "serve", "--base-url", url,
               "--request-rate", str(request_rate), "--num-prompts", str(num_prompts),
               "--dataset-name", "random", "--random-input-len", str(input_len),
               "--random-output-len", str(output_len), "--ignore-eos", "--temperature", "0",
               "--seed", str(seed), "--goodput", f"ttft:{slo_ttft * 1e3}", f"tpot:{slo_tpot * 1e3}",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", tmp,
               "--result-filename", out.name, "--disable-tqdm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if not out.exists():
            raise RuntimeError(f"bench serve failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        report = json.loads(out.read_text())
    # vLLM's result keys: per-request lists in send order, an empty error for a completed request
    requests = [RequestRecord(n_in, n_out, ttft if not err else None, list(itl), e2e if not err else None,
                              err or None)
                for n_in, n_out, ttft, itl, e2e, err in zip(
                    report["input_lens"], report["output_lens"], report["ttfts"], report["itls"],
                    report["latencies"], report["errors"], strict=True)]
    return LoadRun(request_rate, report["duration"], requests, report["request_goodput"],
                   report["request_throughput"], report["output_throughput"], slo_ttft, slo_tpot, report)

"""minirunner.tools.serve_lab, as notebook 09 uses it: a real `minirunner serve` subprocess that is gone
after its `with` block, also when the block raises, and `bench serve` read back as per-request timings."""

from __future__ import annotations

import math

import pytest

from minirunner.tools.serve_lab import ServerProcess, bench_serve


def test_a_server_is_stopped_when_its_block_raises_and_bench_serve_reads_back():
    with pytest.raises(RuntimeError, match="inside the block"):
        with ServerProcess("--max-num-seqs", "2") as server:
            run = bench_serve(server.url, request_rate=math.inf, num_prompts=5, input_len=6, output_len=4,
                              slo_ttft=60.0, slo_tpot=60.0)
            proc = server.proc
            raise RuntimeError("inside the block")
    assert proc.poll() is not None and not server.running  # the process exited
    assert len(run.requests) == 5 and all(r.error is None for r in run.requests)
    assert all(r.prompt_tokens == 6 and r.output_tokens == 4 for r in run.requests)
    # one gap per chunk after the first, as vLLM's client counts: 3 for 4 tokens, fewer when the server
    # merged tokens into one chunk for a client that fell behind (output_collector.py)
    assert all(1 <= len(r.itl) <= 3 and r.ttft <= r.e2e for r in run.requests)
    # a generous SLO: every request is good, so goodput is the request throughput
    assert run.goodput == pytest.approx(run.request_throughput)
    assert run.request_throughput == pytest.approx(5 / run.duration)


def test_a_server_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match="exited with code"):
        ServerProcess("--max-num-seqs", "0").start()

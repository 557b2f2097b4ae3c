"""A GPU results file carries each block's status, and a figure is printed with it: a partial run says
which blocks failed or timed out, and figures that contradict each other (a larger batch with a shorter
step) are named as an anomaly beside every graph figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulators.gpu_results import block_status, gpu_line, load_gpu_run, parse_gpu_run

ROOT = Path(__file__).resolve().parent.parent


def doc(figures: dict, blocks: dict | None = None) -> dict:
    d = {"schema": "minirunner.gpu_run/1", "machine": "m", "gpu": "G",
         "versions": {"torch": "t", "cuda": "c"},
         "commit": "0123456789abcdef", "command": "scripts/gpu_check.sh", "date": "2026-01-02T00:00:00Z",
         "figures": figures}
    if blocks is not None:
        d["blocks"] = blocks
    return d


def step(v, low=None, high=None):
    f = {"value": v, "unit": "ms", "what": "step"}
    return f | ({"low": low, "high": high} if low is not None else {})


def test_block_status_reads_the_gpu_check_report():
    report = {"gpu_tests": {"rc": 1, "timed_out": False, "summary": "2 failed, 36 passed in 69.6s"},
              "graphs": {"rc": 0, "timed_out": False}, "serving": {"rc": 124, "timed_out": True},
              "spec_decode": {"rc": 1, "timed_out": False}, "env": {"rc": 0}}
    assert block_status(report) == {"gpu_tests": "failed (rc 1: 2 failed, 36 passed)", "graphs": "passed",
                                    "spec_decode": "failed (rc 1)", "serving": "timed out"}


def test_a_partial_run_says_so_wherever_a_figure_is_printed():
    run = parse_gpu_run(doc({"graphs.batch1.graph_step_ms": step(3.8)},
                            {"graphs": "passed", "serving": "timed out", "spec_decode": "failed (rc 1)"}))
    line = gpu_line("graphs.batch1.graph_step_ms", run)
    assert "a partial run" in line and "serving timed out" in line and "spec_decode failed (rc 1)" in line
    missing = gpu_line("spec_decode.text/draft_model.speedup_vs_plain", run)
    assert "not measured on a GPU yet" in missing and "spec_decode block failed (rc 1)" in missing
    full = parse_gpu_run(doc({"graphs.batch1.graph_step_ms": step(3.8)}, {"graphs": "passed"}))
    assert "all 1 blocks passed" in full.describe() and "partial" not in full.describe()
    with pytest.raises(ValueError, match="blocks"):
        parse_gpu_run(doc({}, {"graphs": 0}))


def test_a_shorter_step_at_a_larger_batch_is_an_anomaly():
    figures = {"graphs.batch1.eager_step_ms": step(28.8, 28.3, 31.4),
               "graphs.batch64.eager_step_ms": step(19.8, 19.0, 30.4),
               "graphs.batch1.graph_step_ms": step(3.8), "graphs.batch64.graph_step_ms": step(5.6)}
    run = parse_gpu_run(doc(figures, {"graphs": "passed"}))
    [anomaly] = run.anomalies()  # the graph steps grow with the batch: no anomaly there
    assert "eager step at batch 64" in anomaly and "batch 1" in anomaly
    assert "anomaly" in gpu_line("graphs.batch1.graph_step_ms", run)
    monotone = parse_gpu_run(doc({k: step(1.0 + i) for i, k in enumerate(figures)}, {"graphs": "passed"}))
    assert monotone.anomalies() == []


def test_the_committed_h200_run_shows_its_status_and_its_anomaly():
    run = load_gpu_run(ROOT / "benchmarks" / "results" / "gpu_run.json")
    report = json.loads((ROOT / "benchmarks" / "results" / "gpu_check_h200.json").read_text())
    assert run.blocks == block_status(report)  # the statuses come from the run's own report
    assert "serving timed out" in run.status() and "spec_decode failed" in run.status()
    assert any("batch 64" in a for a in run.anomalies())

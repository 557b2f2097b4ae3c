"""The course's one GPU results file: the loader reads a committed run (a fixture here), says "not
measured on a GPU yet" when there is none or a figure is missing, refuses a malformed file, and the
collector refuses a report folder without CUDA (a dry run is not a GPU result)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulators.gpu_results import NOT_MEASURED, RESULTS_PATH, collect, gpu_line, load_gpu_run, parse_gpu_run

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "gpu_run_fixture.json"


def test_a_present_run_renders_its_figure_machine_and_versions_beside_the_cpu_figure():
    run = load_gpu_run(FIXTURE)
    line = gpu_line("graphs.batch1.graph_step_ms", run, cpu="4.11 ms")
    assert NOT_MEASURED not in line
    assert "FIXTURE GPU" in line and "torch 2.13.0+cu128" in line and "CUDA 12.8" in line
    assert "0123456789" in line  # the commit it ran
    assert "0.5 ms (range 0.25-0.75)" in line and "4.11 ms" in line
    assert "8.5x" in gpu_line("graphs.batch1.graph_over_eager", run)


def test_no_run_renders_not_measured_beside_the_cpu_figure(tmp_path):
    run = load_gpu_run(tmp_path / "gpu_run.json")
    assert run is None
    line = gpu_line("graphs.batch1.graph_step_ms", run, cpu="4.11 ms")
    assert line.startswith(f"GPU: {NOT_MEASURED}") and "4.11 ms" in line


def test_a_figure_the_run_lacks_is_not_measured_either():
    run = load_gpu_run(FIXTURE)
    line = gpu_line("graphs.batch64.graph_step_ms", run)
    assert NOT_MEASURED in line and "FIXTURE GPU" in line


@pytest.mark.parametrize("field, value", [("schema", "minirunner.gpu_run/0"), ("gpu", ""),
                                          ("versions", {"torch": "2.13"}), ("figures", [])])
def test_a_malformed_file_is_an_error_not_a_missing_result(tmp_path, field, value):
    doc = json.loads(FIXTURE.read_text())
    doc[field] = value
    bad = tmp_path / "gpu_run.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=field if field != "versions" else "cuda"):
        load_gpu_run(bad)


def test_a_figure_must_be_a_finite_number():
    doc = json.loads(FIXTURE.read_text())
    doc["figures"]["graphs.batch1.graph_step_ms"]["value"] = "fast"
    with pytest.raises(ValueError, match="graphs.batch1.graph_step_ms"):
        parse_gpu_run(doc)


def test_the_committed_results_file_if_any_follows_the_schema():
    # None (nothing measured yet) or a valid run; never a file the notebooks cannot read
    run = load_gpu_run(RESULTS_PATH)
    assert run is None or run.gpu and run.commit and run.command


def _report(folder: Path, cuda: bool) -> Path:
    folder.mkdir()
    env = {"python": "3.11.7", "torch": "2.13.0", "cuda_available": cuda,
           "cuda_version": "12.8" if cuda else None, "machine": "Linux x86_64, 16 CPUs"}
    if cuda:
        env["gpu"] = {"name": "Some GPU", "sms": 132, "memory_GiB": 139.8}
    (folder / "env.json").write_text(json.dumps(env))
    graphs = {"mode": "gpu" if cuda else "dry-run",
              "batches": {"1": {"eager": {"median_step_ms": 3.0, "min_step_ms": 2.5, "max_step_ms": 4.0},
                                "graph": {"median_step_ms": 1.0, "min_step_ms": 0.9, "max_step_ms": 1.5},
                                "graph_over_eager": 3.0}}}
    (folder / "graphs.json").write_text(json.dumps(graphs))
    return folder


def test_the_collector_writes_what_the_loader_reads(tmp_path):
    out = tmp_path / "gpu_run.json"
    report = _report(tmp_path / "r", True)
    subprocess.run([sys.executable, "-m", "simulators.gpu_results", "collect", str(report), "--out", str(out),
                    "--command", "scripts/gpu_check.sh", "--commit", "abc", "--date", "today"],
                   check=True, cwd=ROOT, capture_output=True)
    run = load_gpu_run(out)
    assert run.gpu.startswith("Some GPU") and run.versions["cuda"] == "12.8" and run.commit == "abc"
    fig = run.figure("graphs.batch1.graph_step_ms")
    assert (fig.value, fig.low, fig.high, fig.unit) == (1.0, 0.9, 1.5, "ms")
    assert run.figure("graphs.batch1.graph_over_eager").value == 3.0


def test_the_collector_refuses_a_dry_run(tmp_path):
    with pytest.raises(ValueError, match="dry run"):
        collect(_report(tmp_path / "r", False), command="x", commit="y", date="z")

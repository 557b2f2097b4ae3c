"""Notebooks 06 and 07's GPU-results cells: every figure they ask for is one scripts/gpu_check.sh's
collector writes, a run that has it renders its value (not "not measured"), and no run renders "not
measured on a GPU yet" beside the CPU figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from simulators.gpu_results import NOT_MEASURED, collect, gpu_line, parse_gpu_run

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("06_speculative_decoding.ipynb", "07_model_runner_v2.ipynb")


def _asked(name: str) -> list[str]:
    cells = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    asked = re.findall(r'gpu_line\(f?"([^"]+)"', source)
    return [a.replace("{case}", "") for a in asked]


def _report(tmp_path: Path) -> Path:
    """A gpu_check report folder as its blocks write it, with every block present (made-up values)."""
    def med(x):
        return {"median": x, "min": x * 0.9, "max": x * 1.1}
    (tmp_path / "env.json").write_text(json.dumps({
        "cuda_available": True, "cuda_version": "12.8", "gpu": {"name": "TEST GPU", "memory_GiB": 1.0},
        "machine": "test", "python": "3.11", "torch": "2.13", "triton": "3.9", "transformers": "5.25",
        "flashinfer": "unavailable"}))
    (tmp_path / "graphs.json").write_text(json.dumps({
        "mode": "gpu",
        "batches": {"1": {"eager": {"median_step_ms": 4.0, "min_step_ms": 3.9, "max_step_ms": 4.1},
                          "graph": {"median_step_ms": 0.5, "min_step_ms": 0.4, "max_step_ms": 0.6},
                          "graph_over_eager": 8.0}},
        "roofline_batch1": {"fraction": 0.5, "copy_gb_s": 3000.0}}))
    (tmp_path / "spec.json").write_text(json.dumps({"cases": {"text/draft_model": {
        "speedup_vs_plain": med(1.5), "alpha": med(0.7), "mean_accepted_length": med(2.5),
        "cost_ratio_c": med(0.2)}}}))
    return tmp_path


@pytest.mark.parametrize("name", NAMES)
def test_every_figure_a_notebook_asks_for_is_one_the_collector_writes(name, tmp_path):
    asked = _asked(name)
    assert len(asked) >= 3, asked
    run = parse_gpu_run(collect(_report(tmp_path), command="scripts/gpu_check.sh", commit="0" * 40,
                                date="2026-01-01"))
    missing = [a for a in asked if run.figure(a) is None]
    assert not missing, f"{name} asks for figures gpu_check.sh never writes: {missing}"
    for a in asked:
        line = gpu_line(a, run, cpu="1.00x")
        assert NOT_MEASURED not in line and "TEST GPU" in line and "CPU (this run): 1.00x" in line


@pytest.mark.parametrize("name", NAMES)
def test_without_a_run_every_figure_is_not_measured_beside_the_cpu_figure(name):
    for a in _asked(name):
        line = gpu_line(a, None, cpu="1.00x")
        assert NOT_MEASURED in line and "CPU (this run): 1.00x" in line

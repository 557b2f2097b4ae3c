"""The first cell of every notebook: what this machine runs (simulators/machine.py), and the record of how
long a notebook took, which that cell reads back."""

from __future__ import annotations

import json

from simulators.machine import SKIPPED_NO_CUDA, c_compiler, machine_report, skipped_no_cuda


def test_the_report_reads_back_the_recorded_runtime(tmp_path):
    runtimes = tmp_path / "runtimes.json"
    entry = {"seconds": 90.0, "machine": "2 CPU cores, no GPU",
             "command": "python -m simulators.machine execute"}
    runtimes.write_text(json.dumps({"04_launch_overhead": entry}))
    report = machine_report("04_launch_overhead", runtimes)
    assert "took 1.5 min (2 CPU cores, no GPU" in report
    assert "GPU:" in report and "Triton:" in report and "C compiler" in report and "torch.compile" in report
    assert "not recorded" in machine_report("09_serving_under_load", runtimes)
    assert "not recorded" in machine_report("04_launch_overhead", tmp_path / "absent.json")


def test_the_c_compiler_is_the_one_the_cpu_kernel_would_use(monkeypatch):
    monkeypatch.setenv("CC", "my-cc")
    assert c_compiler() == "my-cc"


def test_a_skipped_gpu_cell_says_so_in_one_line():
    line = skipped_no_cuda("the GPU kernel census")
    assert line.startswith("the GPU kernel census: skipped") and SKIPPED_NO_CUDA in line and "\n" not in line

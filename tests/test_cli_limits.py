"""Command-line flags out of range fail as argparse errors (exit code 2, the flag named), at once.

``minirunner bench``: a batch size of 0 or below, lengths below 1 or MIN above MAX, a float or a huge
request count. ``minirunner generate`` with a prompt that is not UTF-8 (bytes the shell passed): one
line, exit code 2, no traceback. The simulators' CLIs: trace lengths and cache sizes that would run for
minutes or exhaust memory, negative counts, and NaN or infinite floats.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minirunner.cli import main as minirunner_main
from simulators.kv_cli import main as kv_main
from simulators.launch_problems import main as launch_main
from simulators.paging_cli import main as paging_main


def _exit_code(main, argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--hf-batch-size", "-3"], "--hf-batch-size"),
    (["--hf-batch-size", "0"], "--hf-batch-size"),
    (["--input-len", "10", "5"], "--input-len"),
    (["--input-len", "0", "5"], "--input-len"),
    (["--output-len", "-4", "5"], "--output-len"),
    (["--output-len", "8", "-2"], "--output-len"),
    (["--num-requests", "1e9"], "--num-requests"),
    (["--num-requests", str(10**9)], "--num-requests"),
    (["--num-requests", "0"], "--num-requests"),
    (["--kv-cache-memory-bytes", "-1"], "--kv-cache-memory-bytes"),
])
def test_bench_refuses_an_out_of_range_flag_before_running(argv, flag, capsys):
    code, err = _exit_code(minirunner_main, ["bench", "--device", "cpu", *argv], capsys)
    assert code == 2 and flag in err


def test_generate_with_a_prompt_that_is_not_utf8_prints_one_line_and_exits_2(tmp_path):
    run = subprocess.run([sys.executable.encode(), b"-m", b"minirunner", b"generate", b"ROMEO \xff\xfe"],
                         capture_output=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.getcwd(), "LC_ALL": "C.UTF-8"})
    lines = run.stderr.decode("utf-8", "replace").strip().splitlines()
    assert run.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("error:") and "UTF-8" in lines[0], lines


@pytest.mark.parametrize("main, argv, flag", [
    (paging_main, ["policy", "-n", str(10**7)], "-n/--numaddrs"),
    (paging_main, ["tlb", "-n", str(10**7)], "-n/--numaddrs"),
    (paging_main, ["policy", "-C", str(10**9)], "-C/--cachesize"),
    (paging_main, ["tlb", "-C", "0"], "-C/--cachesize"),
    (paging_main, ["multilevel", "-n", str(10**9)], "-n/--numaddrs"),
    (paging_main, ["multilevel", "-n", "-3"], "-n/--numaddrs"),
    (paging_main, ["translate", "-u", "nan"], "-u/--used"),
    (kv_main, ["compare", "-n", str(10**9)], "-n/--requests"),
    (launch_main, ["-n", str(10**9)], "-n/--numkernels"),
    (launch_main, ["-n", "-3"], "-n/--numkernels"),
    (launch_main, ["-l", "nan"], "-l/--launch"),
    (launch_main, ["-l", "inf"], "-l/--launch"),
])
def test_a_simulator_refuses_a_runaway_count_or_a_non_finite_float(main, argv, flag, capsys):
    code, err = _exit_code(main, argv, capsys)
    assert code == 2 and flag in err


def test_a_simulator_flag_inside_its_bounds_still_runs(capsys):
    assert paging_main(["policy", "-n", "50", "-C", "4", "-c"]) == 0
    assert "FINALSTATS" in capsys.readouterr().out
    assert launch_main(["-n", "8", "-l", "5.5"]) == 0

"""What this machine runs, for a notebook's first cell, and the notice before a long compile.

Owns the preflight every course notebook prints first: a CUDA GPU, Triton, a C compiler for the CPU
decode kernel (minirunner/kernels/paged_decode_cpu.py looks for ``$CC``, cc, gcc or clang), a C++
compiler for torch.compile's CPU backend (inductor), and about how long the notebook took when it was
last executed (``notebooks/runtimes.json``, written by ``python -m simulators.machine execute``). Also the
one line a ``gpu`` cell prints where it cannot run. Imports torch only inside the report.

    from simulators.machine import machine_report, compile_notice, SKIPPED_NO_CUDA
    print(machine_report("04_launch_overhead"))
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = ROOT / "notebooks" / "runtimes.json"
SKIPPED_NO_CUDA = "skipped: no CUDA device here (this cell runs on a GPU only; the CPU cells are complete)"

__all__ = ["RUNTIMES", "SKIPPED_NO_CUDA", "c_compiler", "cxx_compiler", "has_triton", "machine_report",
           "compile_notice", "skipped_no_cuda"]


def c_compiler() -> str | None:
    """The C compiler the CPU decode kernel would build with (the same search order), or None."""
    return os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def cxx_compiler() -> str | None:
    """A C++ compiler for torch.compile's CPU code (inductor), or None."""
    return os.environ.get("CXX") or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def has_triton() -> bool:
    """Is Triton importable here (no wheels for macOS or Windows)?"""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _runtime_line(notebook: str, runtimes: Path) -> str:
    try:
        entry = json.loads(runtimes.read_text(encoding="utf-8")).get(notebook)
    except (OSError, json.JSONDecodeError):
        entry = None
    if not entry:
        return "time: not recorded for this notebook yet"
    minutes = entry["seconds"] / 60
    return (f"time: the last full run took {minutes:.1f} min ({entry['machine']}; "
            f"a first run also compiles, later runs reuse the cache)")


def machine_report(notebook: str, runtimes: Path = RUNTIMES) -> str:
    """The notebook's first printout: what runs here, what falls back, and about how long it takes."""
    import torch

    gpu = (f"{torch.cuda.get_device_name(0)}: the cells tagged gpu run" if torch.cuda.is_available()
           else "none: the cells tagged gpu print that they were skipped; every CPU cell runs")
    triton = ("installed" if has_triton() else
              "absent: the torch twins run instead of the Triton kernels (macOS, Windows)")
    cc, cxx = c_compiler(), cxx_compiler()
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads",
             f"GPU: {gpu}",
             f"Triton: {triton}",
             f"C compiler for the CPU decode kernel: {cc or 'none: attention uses its torch twin'}",
             f"torch.compile on the CPU (needs a C++ compiler): "
             f"{cxx or 'no C++ compiler: compiled cells will fail; install one (Xcode tools, gcc)'}",
             _runtime_line(notebook, runtimes)]
    return "\n".join(lines)


def compile_notice(what: str) -> None:
    """Printed before a compile that can take more than about ten seconds, so a silent cell is expected."""
    print(f"compiling {what}: the first run on a machine can take tens of seconds to minutes; "
          "later runs reuse the compile cache", flush=True)


def skipped_no_cuda(what: str) -> str:
    """The one line a gpu cell prints where it cannot run."""
    return f"{what}: {SKIPPED_NO_CUDA}"


def _machine() -> str:
    return f"{os.cpu_count()} CPU cores, no GPU" if not _has_cuda() else f"{os.cpu_count()} CPU cores + GPU"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def execute(notebook: Path, runtimes: Path = RUNTIMES) -> float:
    """Execute a notebook in place (nbconvert, widget state kept), strip its volatile metadata, and record
    its wall time in ``runtimes``. Returns the seconds."""
    notebook = notebook.resolve()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                    "--inplace",
                    "--ExecutePreprocessor.store_widget_state=True", "--ExecutePreprocessor.timeout=1800",
                    notebook.name], cwd=notebook.parent, check=True)
    seconds = time.perf_counter() - t0
    subprocess.run([sys.executable, str(ROOT / "scripts" / "strip_notebook_metadata.py"), str(notebook)],
                   check=True)
    try:
        table = json.loads(runtimes.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        table = {}
    table[notebook.stem] = {"seconds": round(seconds, 1), "machine": _machine(),
                            "command": "python -m simulators.machine execute"}
    runtimes.write_text(json.dumps(dict(sorted(table.items())), indent=2) + "\n", encoding="utf-8")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulators.machine",
                                 description="Print what this machine runs, or execute notebooks and "
                                             "record how long each took.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="what this machine runs")
    r.add_argument("notebook", nargs="?", default="")
    e = sub.add_parser("execute", help="execute notebooks in place and record their wall time")
    e.add_argument("notebooks", nargs="+", type=Path)
    ns = ap.parse_args(argv)
    if ns.cmd == "report":
        print(machine_report(ns.notebook))
        return 0
    for nb in ns.notebooks:
        print(f"{nb.name}: {execute(nb):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

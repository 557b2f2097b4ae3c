"""One GPU run's results as data: the schema of ``benchmarks/results/gpu_run.json``, its loader, the line
a notebook prints beside a CPU figure, and the collector ``scripts/gpu_check.sh`` calls.

Owns the file's shape (machine, GPU name, torch/CUDA versions, commit, command, each block's status,
figures), the rule that a figure absent from it is "not measured on a GPU yet", never a model output, and
the caveats printed with every figure: a partial run says which blocks failed or timed out, and an anomaly
in the figures (a larger batch with a shorter step) is named before a figure is quoted. Pure Python (json):
it imports neither torch nor the runner, so tests and notebooks read it anywhere.

    run = load_gpu_run()                      # None when no GPU run is committed
    print(gpu_line("graphs.batch1.graph_over_eager", run, cpu="1.96x (compile, bucket 1)"))
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = "minirunner.gpu_run/1"
NOT_MEASURED = "not measured on a GPU yet"
RESULTS_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_run.json"
_TOP = ("schema", "machine", "gpu", "versions", "commit", "command", "date", "figures")

__all__ = ["SCHEMA", "NOT_MEASURED", "RESULTS_PATH", "BLOCKS", "Figure", "GpuRun", "load_gpu_run",
           "parse_gpu_run", "gpu_line", "block_status", "commits_behind", "collect"]

# the blocks of scripts/gpu_check.sh, in its report (gpu_check.json)
BLOCKS = ("gpu_tests", "kernel_bench", "graphs", "spec_decode", "serving", "paged_vs_contiguous",
          "tensor_parallel")


@dataclass(frozen=True)
class Figure:
    """One measured number: ``value`` in ``unit`` (median where repeated; ``low``/``high`` its range)."""

    value: float
    unit: str
    what: str
    low: float | None = None
    high: float | None = None

    def __str__(self) -> str:
        unit = "" if self.unit in ("", "x") else f" {self.unit}"
        text = f"{self.value:.3g}{'x' if self.unit == 'x' else ''}{unit}"
        if self.low is not None and self.high is not None:
            text += f" (range {self.low:.3g}-{self.high:.3g})"
        return text


@dataclass(frozen=True)
class GpuRun:
    """A GPU run: where it ran, with what, from which commit and command, and what it measured."""

    machine: str
    gpu: str
    versions: dict
    commit: str
    command: str
    date: str
    figures: dict  # name -> Figure
    blocks: dict = field(default_factory=dict)  # block -> "passed" / "failed (...)" / "timed out"

    def figure(self, name: str) -> Figure | None:
        return self.figures.get(name)

    def describe(self) -> str:
        v = self.versions
        return (f"{self.gpu}, torch {v.get('torch', '?')}, CUDA {v.get('cuda', '?')}, "
                f"commit {self.commit[:10]} of {self.date[:10]}{'; ' + self.status() if self.blocks else ''}")

    def status(self) -> str:
        """Which blocks of the run passed, failed or timed out ("all N blocks passed" when all did)."""
        bad = {b: s for b, s in self.blocks.items() if s != "passed"}
        if not bad:
            return f"all {len(self.blocks)} blocks passed"
        good = [b for b, s in self.blocks.items() if s == "passed"]
        return (f"a partial run: {', '.join(f'{b} {s}' for b, s in bad.items())}; "
                f"passed: {', '.join(good) or 'none'}")

    def anomalies(self) -> list[str]:
        """Figures that contradict each other: a step that is shorter at a larger batch (the same mode).
        Each must be explained before a figure built on it is quoted."""
        found = []
        for mode in ("eager", "graph"):
            steps = sorted((int(n.split(".")[1][5:]), f) for n, f in self.figures.items()
                           if n.startswith("graphs.batch") and n.endswith(f".{mode}_step_ms"))
            for (b1, f1), (b2, f2) in zip(steps, steps[1:], strict=False):
                if f2.value < f1.value:
                    rng = f", range {f2.low:.3g}-{f2.high:.3g}" if f2.low is not None else ""
                    text = (f"the {mode} step at batch {b2} ({f2.value:.3g} ms{rng}) is shorter than at "
                            f"batch {b1} ({f1.value:.3g} ms), though a larger batch does more work")
                    if f2.high is not None and f2.high >= 0.95 * f1.value:
                        text += (f"; some batch-{b2} steps ran at the batch-{b1} level, so the step may have "
                                 "got faster during the run (the batches ran in turn, smallest first) rather "
                                 "than with the batch: not established until a rerun")
                    found.append(text)
        return found


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def parse_gpu_run(doc: dict) -> GpuRun:
    """Check a results document against the schema and return it as a GpuRun (ValueError naming the
    field otherwise)."""
    if not isinstance(doc, dict):
        raise ValueError("a GPU results document is a JSON object")
    missing = [k for k in _TOP if k not in doc]
    if missing:
        raise ValueError(f"GPU results: missing field(s) {', '.join(missing)}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"GPU results: schema {doc['schema']!r}, this loader reads {SCHEMA!r}")
    for key in ("machine", "gpu", "commit", "command", "date"):
        if not isinstance(doc[key], str) or not doc[key].strip():
            raise ValueError(f"GPU results: {key} must be a non-empty string")
    if not isinstance(doc["versions"], dict) or not {"torch", "cuda"} <= set(doc["versions"]):
        raise ValueError("GPU results: versions must name at least torch and cuda")
    if not isinstance(doc["figures"], dict):
        raise ValueError("GPU results: figures must be an object of name -> {value, unit, what}")
    figures = {}
    for name, f in doc["figures"].items():
        if not isinstance(f, dict) or not {"value", "unit", "what"} <= set(f):
            raise ValueError(f"GPU results: figure {name!r} needs value, unit and what")
        low, high = f.get("low"), f.get("high")
        figures[name] = Figure(_number(f["value"], f"figure {name!r} value"), str(f["unit"]), str(f["what"]),
                               None if low is None else _number(low, f"figure {name!r} low"),
                               None if high is None else _number(high, f"figure {name!r} high"))
    blocks = doc.get("blocks", {})
    if not isinstance(blocks, dict) or not all(isinstance(v, str) for v in blocks.values()):
        raise ValueError("GPU results: blocks must be an object of block -> status string")
    return GpuRun(doc["machine"], doc["gpu"], dict(doc["versions"]), doc["commit"], doc["command"],
                  doc["date"], figures, dict(blocks))


def load_gpu_run(path: str | Path | None = None) -> GpuRun | None:
    """The committed GPU run (``benchmarks/results/gpu_run.json`` by default), or None when there is
    none. A file that is there but malformed raises ValueError: it is never read as "not measured"."""
    p = Path(path) if path is not None else RESULTS_PATH
    if not p.exists():
        return None
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p.name} is not valid JSON: {e}") from e
    return parse_gpu_run(doc)


def gpu_line(name: str, run: GpuRun | None, cpu: str | None = None) -> str:
    """What a notebook prints for figure ``name``: the GPU figure with its machine, or "not measured
    on a GPU yet", and the CPU figure beside it when one is given."""
    fig = run.figure(name) if run is not None else None
    if fig is None:
        block = run.blocks.get(name.split(".")[0]) if run is not None else None
        why = f": its {name.split('.')[0]} block {block}" if block and block != "passed" else ""
        gpu = f"GPU: {NOT_MEASURED}" + ("" if run is None else f" (no {name} in the run on {run.gpu}{why})")
    else:
        gpu = f"GPU ({run.describe()}): {fig} — {fig.what}"
        if name.startswith("graphs.") and run.anomalies():
            gpu += "\n  anomaly, unexplained: " + "; ".join(run.anomalies())
    return gpu if cpu is None else f"{gpu}\n  beside it, CPU (this run): {cpu}"


def commits_behind(run: GpuRun, root: str | Path | None = None) -> int | None:
    """How many commits this checkout is past the run's commit (None without git, or when the run's
    commit is not in this checkout's history)."""
    import subprocess

    where = Path(root) if root is not None else RESULTS_PATH.parents[2]
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-list", "--count", f"{run.commit}..HEAD"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None


def block_status(report: dict) -> dict:
    """scripts/gpu_check.sh's report (gpu_check.json) -> {block: "passed" | "failed (...)" | "timed out"}."""
    blocks = {}
    for name in BLOCKS:
        b = report.get(name)
        if not isinstance(b, dict) or "rc" not in b:
            continue
        if b.get("timed_out"):
            blocks[name] = "timed out"
        elif b["rc"] == 0:
            blocks[name] = "passed"
        else:
            summary = str(b.get("summary", "")).split(" in ")[0]
            blocks[name] = f"failed (rc {b['rc']}{': ' + summary if summary else ''})"
    return blocks


# ---------------------------------------------------------------------------------------------
# the collector: scripts/gpu_check.sh's per-block reports -> one results document

def _load(report_dir: Path, name: str) -> dict:
    p = report_dir / name
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}  # a block that failed or timed out measured nothing


def _put(figures: dict, name: str, value, unit: str, what: str, low=None, high=None) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        figures[name] = {"value": float(value), "unit": unit, "what": what,
                         **({"low": float(low), "high": float(high)} if low is not None and high is not None
                            else {})}


def collect(report_dir: str | Path, *, command: str, commit: str, date: str) -> dict:
    """The results document from a ``scripts/gpu_check.sh`` report folder (env.json, graphs.json,
    spec.json, serving.json). Refuses a run without CUDA: a dry run is not a GPU result."""
    d = Path(report_dir)
    env = _load(d, "env.json")
    if not env.get("cuda_available") or not isinstance(env.get("gpu"), dict):
        raise ValueError(f"{d}/env.json records no CUDA device: a dry run is not a GPU result")
    figures: dict = {}
    graphs = _load(d, "graphs.json")
    if graphs.get("mode") == "gpu":
        for b, row in graphs.get("batches", {}).items():
            for label in ("eager", "graph"):
                r = row.get(label, {})
                _put(figures, f"graphs.batch{b}.{label}_step_ms", r.get("median_step_ms"), "ms",
                     f"{label} decode step, Qwen3-0.6B shape, bf16, batch {b} (median of the steps)",
                     r.get("min_step_ms"), r.get("max_step_ms"))
            _put(figures, f"graphs.batch{b}.graph_over_eager", row.get("graph_over_eager"), "x",
                 f"CUDA-graph over eager decode tok/s, Qwen3-0.6B shape, batch {b}")
        roof = graphs.get("roofline_batch1", {})
        _put(figures, "graphs.roofline_batch1.fraction", roof.get("fraction"), "",
             "weight bytes per graph step at batch 1 / step time, over the measured copy bandwidth")
        _put(figures, "graphs.roofline_batch1.copy_gb_s", roof.get("copy_gb_s"), "GB/s",
             "device copy bandwidth (read + write) of a 1 GiB buffer")
    for case, row in _load(d, "spec.json").get("cases", {}).items():
        for metric in ("speedup_vs_plain", "alpha", "mean_accepted_length", "cost_ratio_c"):
            m = row.get(metric)
            if isinstance(m, dict):
                unit = "x" if "speedup" in metric else ""
                _put(figures, f"spec_decode.{case}.{metric}", m.get("median"), unit,
                     f"speculative decoding {case}, {metric} (median of the repeats)",
                     m.get("min"), m.get("max"))
    serving = _load(d, "serving.json")
    _put(figures, "serving.ratio_output_tok_per_s", serving.get("ratio_output_tok_per_s"), "x",
         "minirunner over transformers generate, output tok/s (nano-vllm's workload, Qwen3-0.6B shape)")
    gpu = env["gpu"]
    versions = {k: str(env.get(k)) for k in ("python", "torch", "triton", "transformers", "flashinfer")}
    versions["cuda"] = str(env.get("cuda_version"))
    return {"schema": SCHEMA, "machine": str(env.get("machine", "unknown")),
            "gpu": f"{gpu.get('name', 'unknown GPU')} ({gpu.get('memory_GiB', '?')} GiB)",
            "versions": versions, "commit": commit, "command": command, "date": date,
            "blocks": block_status(_load(d, "gpu_check.json")), "figures": figures}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulators.gpu_results",
                                 description="Collect a gpu_check report folder into one results file, "
                                             "or show the committed one.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="report folder -> results document")
    c.add_argument("report_dir")
    c.add_argument("--out", required=True)
    c.add_argument("--command", required=True)
    c.add_argument("--commit", required=True)
    c.add_argument("--date", required=True)
    s = sub.add_parser("show", help="print the figures of a results file")
    s.add_argument("path", nargs="?", default=None)
    ns = ap.parse_args(argv)
    if ns.cmd == "collect":
        doc = collect(ns.report_dir, command=ns.command, commit=ns.commit, date=ns.date)
        parse_gpu_run(doc)  # what is written is what the loader reads
        Path(ns.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"gpu_results: {len(doc['figures'])} figures -> {ns.out}")
        return 0
    run = load_gpu_run(ns.path)
    if run is None:
        print(f"GPU: {NOT_MEASURED}")
        return 0
    print(run.describe(), "|", run.command)
    for name in sorted(run.figures):
        print(f"  {name}: {run.figures[name]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The rules of the house (DESIGN.md), checked: no file in minirunner/ over 300 lines, no object reaching
into another's private members (ruff's SLF001 on minirunner/), the core never importing tools/, and no
result handed over through an attribute of the runner."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minirunner"
MAX_LINES = 300


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_no_file_in_the_runner_is_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concept (DESIGN.md, 'Small rooms'): {long}"


def test_no_private_member_access_across_objects():
    ruff = shutil.which("ruff")
    cmd = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    proc = subprocess.run([*cmd, "check", "--select", "SLF001", "--output-format", "concise",
                           str(PACKAGE)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_core_never_imports_tools():
    # The CLI is the entry point of `minirunner bench`, not part of the core.
    core = [p for p in _modules() if "tools" not in p.relative_to(PACKAGE).parts and p.name != "cli.py"]
    bad = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.startswith("minirunner.tools"))
           for p in core}
    assert not {k: v for k, v in bad.items() if v}


def test_the_worker_never_imports_the_engine():
    # Data across the worker boundary (DESIGN.md): the worker reads the scheduler's output from
    # minirunner/core/sched/output.py, never a live Request, scheduler or engine module.
    worker = sorted((PACKAGE / "worker").rglob("*.py"))
    bad = {}
    for p in worker:
        tree = ast.parse(p.read_text())
        names = set(_imports(p)) | {f"{n.module}.{a.name}" for n in ast.walk(tree)
                                    if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
        hits = sorted(m for m in names if m == "minirunner.engine" or m.startswith("minirunner.engine."))
        if hits:
            bad[str(p.relative_to(ROOT))] = hits
    assert not bad, f"the worker reads data (core/sched/output.py), not engine objects: {bad}"


def test_the_draft_model_is_a_worker_component():
    # Issue 53: the draft model shares the target's block tables, rows and step buffers. Nothing under
    # spec_decode/ or worker/ imports the engine, and spec_decode/ builds no KV manager, runner,
    # scheduler or sequence of its own.
    bad = {}
    for p in sorted((PACKAGE / "spec_decode").rglob("*.py")) + sorted((PACKAGE / "worker").rglob("*.py")):
        tree = ast.parse(p.read_text())
        names = set(_imports(p)) | {f"{n.module}.{a.name}" for n in ast.walk(tree)
                                    if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
        hits = sorted(m for m in names if m == "minirunner.engine" or m.startswith("minirunner.engine.")
                      or m.startswith("minirunner.kv.manager"))
        if "spec_decode" in p.parts:
            built = {n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(tree)
                     if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}
            hits += sorted(built & {"KVCacheManager", "ContiguousKVManager", "BlockPool", "ModelRunner",
                                    "Scheduler", "ScheduledRequest", "Sequence", "RunnableSequence",
                                    "WorkerRowsSent", "Request"})
        if hits:
            bad[str(p.relative_to(ROOT))] = hits
    assert not bad, f"the draft model reads the target's parts as data: {bad}"


def test_a_step_reaches_the_device_only_through_execute():
    # Issue 33: ``ModelRunner.execute`` is the only way a step reaches the device; the draft model's
    # passes after each step run inside it (spec_decode/draft_passes.py, called by the drafter).
    allowed = {PACKAGE / "worker" / "model_runner.py": ("run_model", "graphs.run"),
               PACKAGE / "distributed" / "tp_runner.py": ("run_model",),  # its override calls the base
               PACKAGE / "spec_decode" / "draft_passes.py": ("graphs.run",)}
    bad = []
    for p in _modules():
        text = p.read_text()
        for call in ("run_model", "graphs.run", "forward_logits"):
            if f".{call}(" in text and call not in allowed.get(p, ()):
                bad.append(f"{p.relative_to(ROOT)}: .{call}(")
    assert not bad, f"launch steps with ModelRunner.execute: {bad}"


def test_the_kernel_or_twin_choice_is_made_in_one_place():
    # DESIGN.md, "One mechanism per idea": kernels/_triton.use_triton chooses between a Triton kernel
    # and its torch twin; nothing else reads whether Triton is installed.
    home = PACKAGE / "kernels" / "_triton.py"
    readers = [str(p.relative_to(ROOT)) for p in _modules() if p != home and "HAS_TRITON" in p.read_text()]
    assert not readers, f"choose with minirunner.kernels._triton.use_triton: {readers}"


def _writes_of(path: Path, attr: str) -> list[int]:
    """Lines of ``path`` that assign to (or augment) an attribute named ``attr``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and t.attr == attr:
                    lines.append(node.lineno)
    return lines


def test_one_writer_of_num_computed_tokens():
    # DESIGN.md, "One writer per state": a request's host count is the scheduler's alone (cached tokens
    # at admission, a fork's start, rejected drafts read from the runner's output). The draft model
    # keeps no count of its own: it runs over the target's tokens each step.
    allowed = {"minirunner/engine/scheduler.py"}
    writers = {str(p.relative_to(ROOT)): lines for p in _modules()
               if (lines := _writes_of(p, "num_computed_tokens"))}
    assert set(writers) <= allowed, {k: v for k, v in writers.items() if k not in allowed}


@pytest.mark.parametrize("name", ["last_step", "last_logprobs", "last_prompt_logprobs", "keep_logits",
                                  "last_logits"])
def test_no_result_travels_through_an_attribute(name):
    # A step's results are return values (RunnerOutput, AppliedStep, EngineStep), not attributes one
    # object sets for another to read.
    hits = [str(p.relative_to(ROOT)) for p in _modules() if f".{name}" in p.read_text()]
    assert not hits, hits


def test_the_prepared_gpu_run_fits_in_six_minutes():
    # The GPU branch of scripts/gpu_check.sh (after the dry-run branch's `else`) and the environment
    # probe: their `timeout` limits add up to at most 360 s, so a run, a rerun and their machine starts
    # (about 35 s each on an H200) fit in the 15 minutes of device time a task is lent.
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    gpu_branch = text.split("\nelse\n", 1)[1].split("\nfi\n", 1)[0]
    limits = [int(m) for m in re.findall(r"\btimeout (\d+)", gpu_branch)]
    probe = [int(m) for m in re.findall(r'^timeout (\d+) "\$PY" - "\$REPORT_DIR/env.json"', text, re.M)]
    assert len(limits) == 7 and len(probe) == 1
    assert sum(limits) + probe[0] <= 360, (limits, probe)


def test_the_engine_calls_nothing_on_the_runner_but_execute():
    # Issue 53, "only data crosses": finished and preempted ids and block copies travel in the
    # SchedulerOutput; the engine launches a step with execute and reads its output, nothing else.
    bad = []
    for p in sorted((PACKAGE / "engine").rglob("*.py")):
        if p.name == "build.py":  # builds the runner (graphs, proposer) before any step
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name == "runner" and node.func.attr != "execute":
                    bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: runner.{node.func.attr}(")
    assert not bad, f"send it in the SchedulerOutput instead: {bad}"


def test_no_thread_local_step_state():
    # Issue 53, "no hidden per-step state": a step's metadata is passed down or scoped visibly around
    # one forward (worker/compiled_forward.forward_context), never kept in a thread-local.
    bad = [str(p.relative_to(ROOT)) for p in _modules() if "threading.local" in p.read_text()]
    assert not bad, bad

"""No notebook asserts on a measured time: a timing depends on the machine's load, so an assertion on one
fails on a student's busy laptop. Measured times are shown with their spread, unasserted.

An assert whose line ends with ``# shape: <why>`` is exempt: an assertion on the shape of a measured
result that holds on any machine (an ordering of latencies well past a queueing knee, goodput at most
throughput), with the reason on the line.

A static check over each notebook's code cells, in order (a value computed in one cell and asserted in a
later one is caught): a name is *timed* when it is assigned from an expression that calls a clock
(``time.perf_counter``, ``time.time``, ``thread_time``, ``process_time``, ``monotonic``, CUDA
events' ``elapsed_time``, the ``timeit`` module), a benchmark helper (``measure_*``, ``replay_times``,
``calibrate_*``, ``run_bench``, ``bench*``), a function the notebook defines that does either, or reads a
timed name or a timing field (``duration_s``, ``time_to_first_token``, ...). An ``assert`` that reads a
timed name fails.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))

CLOCKS = re.compile(r"^(perf_counter(_ns)?|time(_ns)?|thread_time(_ns)?|process_time(_ns)?|monotonic(_ns)?"
                    r"|elapsed_time|timeit)$")
BENCH_HELPERS = re.compile(r"^(measure_\w*|replay_times|calibrate_\w*|run_bench|bench\w*|timed\w*)$")
TIMING_FIELDS = re.compile(r"^(duration_s|propose_s|verify_s|time_to_first_token|elapsed\w*|latency\w*"
                           r"|\w*_seconds|\w*_ms|tokens_per_s\w*)$")
MAGIC = re.compile(r"^\s*(?:(\w+)\s*=\s*)?[%!]")


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _reads_time(node: ast.AST, timed: set[str]) -> bool:
    # names bound by a comprehension inside the expression are local to it (their source is walked too)
    local = {n.id for c in ast.walk(node) if isinstance(c, ast.comprehension)
             for n in ast.walk(c.target) if isinstance(n, ast.Name)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in timed and sub.id not in local:
            return True
        if isinstance(sub, ast.Call):
            if isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name) \
                    and sub.func.value.id == "timeit":
                return True  # timeit.timeit / timeit.repeat
            name = _called_name(sub)
            if name and (CLOCKS.match(name) or BENCH_HELPERS.match(name) or name in timed):
                return True
        if isinstance(sub, ast.Attribute) and TIMING_FIELDS.match(sub.attr):
            return True
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) \
                and isinstance(sub.slice.value, str) and TIMING_FIELDS.match(sub.slice.value):
            return True
    return False


def _bind(target: ast.AST, is_timed: bool, timed: set[str]) -> None:
    """Assignment to ``target``: a plain name becomes timed or untimed with its value; a name written
    through an item or attribute (``d[k] = t``) becomes timed, never untimed, by it."""
    if isinstance(target, ast.Name):
        (timed.add if is_timed else timed.discard)(target.id)
    elif isinstance(target, (ast.Tuple, ast.List, ast.Starred)):
        for elt in (target.elts if not isinstance(target, ast.Starred) else [target.value]):
            _bind(elt, is_timed, timed)
    elif is_timed:
        for n in ast.walk(target):
            if isinstance(n, ast.Name):
                timed.add(n.id)
                break


def _parse(source: str, timed: set[str]) -> ast.Module:
    """The cell as Python: IPython magics and shell lines become ``pass`` (``x = %timeit -o ...`` makes x
    timed)."""
    lines = []
    for line in source.splitlines():
        m = MAGIC.match(line)
        if m:
            if m.group(1) and "timeit" in line:
                line = line[:len(line) - len(line.lstrip())] + f"{m.group(1)} = timeit()"
            else:
                line = line[:len(line) - len(line.lstrip())] + "pass"
        lines.append(line)
    return ast.parse("\n".join(lines))


def _timed_functions(trees: list[ast.Module]) -> set[str]:
    """Functions the notebook defines that read a clock or a benchmark helper, directly or through
    another such function (to a fixed point)."""
    defs = [n for t in trees for n in ast.walk(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    timed: set[str] = set()
    changed = True
    while changed:
        changed = False
        for d in defs:
            if d.name not in timed and any(_reads_time(stmt, timed) for stmt in d.body):
                timed.add(d.name)
                changed = True
    return timed


def _run(body: list[ast.stmt], timed: set[str], source: str, cell: int, found: set) -> None:
    """Follow the statements in order: which names hold a timed value, and which asserts read one."""
    for st in body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # functions were classified up front
        if isinstance(st, ast.Assign):
            is_timed = _reads_time(st.value, timed)
            for target in st.targets:
                _bind(target, is_timed, timed)
        elif isinstance(st, (ast.AnnAssign, ast.AugAssign)) and st.value is not None:
            is_timed = _reads_time(st.value, timed)
            if is_timed or isinstance(st, ast.AnnAssign):
                _bind(st.target, is_timed, timed)
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            _bind(st.target, _reads_time(st.iter, timed), timed)
            for _ in range(2):  # twice: a value timed late in the body reaches the next iteration
                _run(st.body, timed, source, cell, found)
            _run(st.orelse, timed, source, cell, found)
        elif isinstance(st, (ast.While, ast.If)):
            _run(st.body, timed, source, cell, found)
            _run(st.orelse, timed, source, cell, found)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                if item.optional_vars is not None:
                    _bind(item.optional_vars, _reads_time(item.context_expr, timed), timed)
            _run(st.body, timed, source, cell, found)
        elif isinstance(st, ast.Try):
            for part in (st.body, *(h.body for h in st.handlers), st.orelse, st.finalbody):
                _run(part, timed, source, cell, found)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                and isinstance(st.value.func, ast.Attribute) \
                and st.value.func.attr in ("append", "extend", "update", "add", "insert") \
                and _reads_time(st.value, timed):
            _bind(st.value.func.value, True, timed)  # times.append(t1 - t0) makes times timed
        elif isinstance(st, ast.Assert) and _reads_time(st.test, timed) and not _shape(source, st):
            found.add((cell, st.lineno, ast.get_source_segment(source, st) or ast.unparse(st)))


SHAPE = re.compile(r"#\s*shape:\s*\S")


def _shape(source: str, st: ast.Assert) -> bool:
    """An assert on measured data that says, on its last line, why it holds whatever the machine's load
    (``# shape: <why>``: an ordering past a queueing knee, a count that is a subset of another); the
    reason is part of the line a reviewer reads."""
    return bool(SHAPE.search(source.splitlines()[(st.end_lineno or st.lineno) - 1]))


def timing_assertions(cells: list[str]) -> list[tuple[int, int, str]]:
    """(cell index, line, assert source) of every assert on a timed value, over the cells in order."""
    trees = []
    for source in cells:
        try:
            trees.append(_parse(source, set()))
        except SyntaxError:
            trees.append(ast.Module(body=[], type_ignores=[]))
    timed = _timed_functions(trees)
    found: set = set()
    for i, (tree, source) in enumerate(zip(trees, cells, strict=True)):
        _run(tree.body, timed, source, i, found)
    return sorted(found)


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_asserts_a_measured_time(path):
    found = timing_assertions(_code_cells(path))
    assert not found, "assertions on measured times (show the timing with its spread instead):\n" + \
        "\n".join(f"  code cell {i}, line {line}: {text}" for i, line, text in found)


# -- the checker itself -------------------------------------------------------------------------------
@pytest.mark.parametrize("cells", [
    ["import time\nt0 = time.perf_counter()\nrun()\nt = time.perf_counter() - t0", "assert t < 1.0"],
    ["from time import perf_counter as now\ndef timed(f):\n    s = now()\n    f()\n    return now() - s",
     "c = timed(a) / timed(b)\nassert c > flop_ratio, 'launch overhead keeps the draft dearer'"],
    ["def step_ms(llm):\n    t0 = time.time()\n    llm.step()\n    return 1e3 * (time.time() - t0)",
     "times = []\nfor _ in range(5):\n    times.append(step_ms(llm))", "assert min(times) > 0.1"],
    ["res = measure_decode_steps([llm], (1, 8))", "speedup = res[1] / res[8]", "assert speedup > 2"],
    ["r = %timeit -o f()", "assert r.best < 1e-3"],
    ["import timeit\nbest = min(timeit.repeat(f, number=10))", "assert best < 1e-3"],
    ["trace = llm.get_step_trace()", "assert trace[0]['duration_s'] < 0.5"],
    ["outs = llm.generate(p)", "assert outs[0].metrics.time_to_first_token < 1"],
], ids=["perf_counter", "helper_in_earlier_cell", "appended_in_loop", "bench_helper", "timeit_magic",
        "timeit_repeat",
        "trace_field", "metrics_field"])
def test_the_lint_catches_a_timing_assertion(cells):
    assert timing_assertions(cells), "a timing assertion went unnoticed"


def test_a_shape_assertion_needs_its_reason_on_the_line():
    cells = ["runs = bench_serve(url)",
             "assert runs.goodput <= runs.throughput  # shape: good ones completed",
             "assert runs.ttft_p50 > 0.1  # shape:", "assert runs.ttft_p50 > 0.1  # the queue"]
    assert [line for _, line, _ in timing_assertions(cells)] == [1, 1]  # the bare marker and the comment


def test_the_lint_passes_deterministic_assertions():
    cells = ["import time\nt0 = time.perf_counter()\ncount = record_decode_step(llm).total",
             "print(f'{time.perf_counter() - t0:.3f} s')",
             "assert count == 204\nassert flops(8) == 8 * flops(1)",
             "drafts = d_logits.argmax().repeat(4)\nassert drafts.numel() == 4",
             "%matplotlib inline\n!ls"]
    assert timing_assertions(cells) == []

"""Grade one course notebook submission against its master (used by scripts/course.py).

Owns reading the ``course:`` cell tags of a master, rebuilding a question for a student's id in this
process (the reference never enters the student's kernel), running the submission in a fresh kernel
with nbclient, and turning the verdicts into Gradescope's results.json. The tags and line markers are
described in scripts/course.py.
"""

from __future__ import annotations

import ast
import copy
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from simulators.classroom import PRACTICE_DIR, student_seed, to_literal  # noqa: F401  (student_seed: build())

MARK = "__COURSE__"
DEFAULT_POINTS = {"answer": 1.0, "implement": 3.0}


def tag_args(cell, kind: str, _n: int | None = None) -> list[tuple[str, ...]]:
    """The arguments of every ``course:<kind>:a:b`` tag of a cell, as tuples (``()`` for no argument)."""
    out = []
    for t in cell.get("metadata", {}).get("tags", []):
        parts = t.split(":")
        if parts[:2] == ["course", kind]:
            out.append(tuple(parts[2:]))
    return out


@dataclass
class Question:
    kind: str  # "answer", "implement" or "written"
    name: str  # the exercise, task or written question's name
    points: float
    cell: int  # index of its cell in the master
    title: str
    function: str = ""
    gpu: bool = False


def _title(nb, index: int) -> str:
    for cell in reversed(nb.cells[:index]):
        if cell.cell_type == "markdown" and not tag_args(cell, "rubric") and not tag_args(cell, "written"):
            bold = re.search(r"\*\*(.+?)\*\*", cell.source)
            return (bold.group(1) if bold else cell.source.strip().split("\n")[0]).rstrip(".")
    return ""


def question_above(nb, index: int, name: str) -> str:
    """The text of written question ``name``: the markdown cell above its answer cell."""
    for i, cell in enumerate(nb.cells):
        if (name,) in tag_args(cell, "written"):
            for above in reversed(nb.cells[:i]):
                if above.cell_type == "markdown":
                    return above.source.strip()
    return ""


def questions(master) -> list[Question]:
    """The graded questions of a master notebook, in order."""
    out = []
    for i, cell in enumerate(master.cells):
        points = [float(p[0]) for p in tag_args(cell, "points")]
        gpu = "gpu" in cell.get("metadata", {}).get("tags", [])
        for (name,) in tag_args(cell, "answer"):
            out.append(Question("answer", name, points[0] if points else DEFAULT_POINTS["answer"], i,
                                _title(master, i), gpu=gpu))
        for name, function in tag_args(cell, "implement"):
            out.append(Question("implement", name, points[0] if points else DEFAULT_POINTS["implement"],
                                i, _title(master, i), function=function, gpu=gpu))
        for (name,) in tag_args(cell, "written"):
            rubric = [c for c in master.cells if any(r[0] == name for r in tag_args(c, "rubric"))]
            pts = float(tag_args(rubric[0], "rubric")[0][1]) if rubric else 0.0
            out.append(Question("written", name, pts, i, _title(master, i)))
    return out


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: it holds no question
        return None


def build(master, name: str, student_id: str) -> Any:
    """The object a master assigns to ``name`` (an exercise or an implement-it), rebuilt here for
    ``student_id``: the master's imports, then the functions and the assignment of that cell."""
    imports, target = [], None
    for cell in master.cells:
        tree = _parse(cell.source) if cell.cell_type == "code" else None
        if tree is None:
            continue
        imports += [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assigns = [n for n in tree.body if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
        if assigns and target is None:
            defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
            target = defs + assigns[:1]
    if target is None:
        raise ValueError(f"the master assigns nothing to {name!r}: tag the cell that builds it")
    namespace: dict[str, Any] = {"STUDENT_ID": student_id, "__name__": "course_master"}
    exec(compile(ast.Module(body=imports + target, type_ignores=[]), f"<master {name}>", "exec"), namespace)
    return namespace[name]


def unwrap(obj: Any) -> Any:
    """The ImplementIt inside a hinted task (or the object itself)."""
    return getattr(obj, "task", obj)


def _stub_body(node) -> bool:
    """Whether a function's body is only a docstring and ``raise NotImplementedError`` (or ``...``)."""
    body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if not body:
        return True  # a docstring or ``...``: it does nothing
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id in ("NotImplementedError", "NotImplementedYet")


def is_stub(source: str, function: str) -> bool:
    """Whether ``function``'s body in ``source`` is only a docstring and ``raise NotImplementedError``;
    for a class of that name, whether its ``__init__`` raises so and every other method is a stub too."""
    tree = _parse(source)
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return _stub_body(node) and any(isinstance(n, ast.Raise) for n in node.body)
        if isinstance(node, ast.ClassDef) and node.name == function:
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
            init = [m for m in methods if m.name == "__init__"]
            return bool(init) and all(_stub_body(m) for m in methods) and any(
                isinstance(n, ast.Raise) for n in init[0].body)
    return False


def _cell(source: str):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["course_grader"] = True
    return cell


def _capture_answer(name: str) -> str:
    return (f"try:\n    print({MARK!r}, repr({{'answer': {name!r}, 'value': __course_literal(my_answer)}}))\n"
            f"except Exception as __course_e:\n"
            f"    print({MARK!r}, repr({{'answer': {name!r}, 'error': repr(__course_e)}}))")


def expected_output(task, case) -> Any:
    """The reference's output on one case: ``task.expected(case)`` for a task whose driver records
    data that is compared with the reference's record (e.g. ``simulators.graph_replay:observe``),
    ``task.reference(**case)`` otherwise."""
    if getattr(task, "driver", None) and hasattr(task, "expected"):
        return task.expected(case)
    return task.reference(**case)


def _run_cases(name: str, function: str, cases: list, driver: str | None = None) -> str:
    """The grader's cell after an implement-it: the student's ``function`` on each case. A task with a
    ``driver`` ("module:function", e.g. for a class or a toy world) has the driver run it: a dict case
    is keyword arguments (``driver(function, **case)``), any other case one argument."""
    if driver:
        module, attr = driver.split(":")
        head = f"from {module} import {attr} as __course_driver\n"
        call = (f"(__course_driver({function}, **__course_case) if isinstance(__course_case, dict) "
                f"else __course_driver({function}, __course_case))")
    else:
        head, call = "", f"{function}(**__course_case)"
    return (f"{head}__course_out = []\nfor __course_case in {cases!r}:\n"
            f"    try:\n"
            f"        __course_out.append({{'value': __course_literal({call})}})\n"
            f"    except NotImplementedError:\n        __course_out.append({{'not_implemented': True}})\n"
            f"        break\n"
            f"    except Exception as __course_e:\n"
            f"        __course_out.append({{'error': f'{{type(__course_e).__name__}}: {{__course_e}}'}})\n"
            f"print({MARK!r}, repr({{'implement': {name!r}, 'outputs': __course_out}}))")


def _submission_id(nb) -> str:
    for cell in nb.cells:
        if tag_args(cell, "student-id"):
            for node in (_parse(cell.source) or ast.Module(body=[])).body:
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                        and any(isinstance(t, ast.Name) and t.id == "STUDENT_ID" for t in node.targets)):
                    return str(node.value.value).strip()
    return ""


def _find_master(release: Path, nb, path: Path) -> Path:
    folder = release / "autograder" / "masters"
    if not folder.is_dir():
        raise SystemExit(f"{folder} is missing: pass the DIR given to `course.py release --out DIR`")
    stem = nb.metadata.get("course", {}).get("notebook") or path.stem
    for candidate in sorted(folder.glob("*.ipynb")):
        if candidate.stem == stem or candidate.stem[:3] == stem[:3]:
            return candidate
    raise SystemExit(f"{path.name}: no master notebook matches it in {folder} (name it as released)")


def _cells_by_tag(nb, kind: str, name: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if any(a and a[0] == name for a in tag_args(c, kind))]


def _execute(nb, workdir: Path, timeout: int) -> tuple[list[dict], str]:
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(workdir)}})
    note = ""
    try:
        client.execute()
    except (CellTimeoutError, DeadKernelError, RuntimeError) as e:
        note = f"the notebook did not run to the end: {type(e).__name__}: {str(e)[:300]}"
    records = []
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("course_grader"):
            text = "".join(out.get("text", "") for out in cell.get("outputs", []))  # streams come in chunks
            for line in text.splitlines():
                if line.startswith(MARK):
                    try:
                        records.append(ast.literal_eval(line[len(MARK):].strip()))
                    except (ValueError, SyntaxError, MemoryError, RecursionError):
                        pass  # the student's code printed over it: graded as missing
    return records, note


def _gpu_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def grade(release: Path, path: Path, student_id: str | None, timeout: int = 120) -> dict:
    """Gradescope's results.json for one submission."""
    t0 = time.perf_counter()
    nb = nbformat.read(path, 4)
    master_path = _find_master(Path(release), nb, path)
    master, stem = nbformat.read(master_path, 4), master_path.stem
    written_id = _submission_id(nb)
    sid = (student_id or written_id).strip()
    if not sid:
        raise SystemExit(f"{path.name}: no student id: pass --student-id, or set STUDENT_ID in its "
                         "first cell")
    qs = questions(master)
    gpu = _gpu_present()
    tests: list[dict] = []
    if written_id and written_id != sid:
        tests.append({"name": "student id", "score": 0.0, "max_score": 0.0,
                      "output": f"the notebook says STUDENT_ID = {written_id!r}; graded as {sid!r}, "
                                "the id this submission came from"})
    built = {q.name: build(master, q.name, sid) for q in qs if q.kind != "written"}
    # the submission's cells, with the grader's own cells around the graded ones
    cells = [_cell("from simulators.classroom import to_literal as __course_literal")]
    for cell in nb.cells:
        answers = [a[0] for a in tag_args(cell, "answer") if a]
        implements = [a for a in tag_args(cell, "implement") if len(a) == 2]
        if answers:
            cells.append(_cell("my_answer = None"))
        for _name, function in implements:
            cells.append(_cell(f"globals().pop({function!r}, None)"))
        cells.append(cell)
        if tag_args(cell, "student-id"):
            cells.append(_cell(f"STUDENT_ID = {sid!r}"))
        for name in answers:
            cells.append(_cell(_capture_answer(name)))
        for name, function in implements:
            task = unwrap(built[name])
            driver = getattr(task, "driver", None) or None
            # arrays travel as lists; a driver's case that is not a dict is one argument, kept whole
            cases = [to_literal(c if driver and not isinstance(c, dict) else dict(c)) for c in task.cases]
            cells.append(_cell(_run_cases(name, function, cases, driver)))
    run = copy.deepcopy(nb)
    run.cells = cells
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(release) / "autograder" / PRACTICE_DIR
        if data.is_dir():
            import shutil
            shutil.copytree(data, Path(tmp) / PRACTICE_DIR)
        records, note = _execute(run, Path(tmp), timeout)
    got_answers = {r["answer"]: r for r in records if "answer" in r}
    got_outputs = {r["implement"]: r["outputs"] for r in records if "implement" in r}
    for q in qs:
        name = f"{stem} {q.name}: {q.title}" if q.title else f"{stem} {q.name}"
        entry = {"name": name, "score": 0.0, "max_score": q.points, "visibility": "visible"}
        if q.kind == "written":
            idx = _cells_by_tag(nb, "written", q.name)
            text = nb.cells[idx[0]].source.strip() if idx else ""
            blank = text == master.cells[q.cell].source.strip() or not text
            entry.update(max_score=0.0, output=(f"written: {q.points:g} points, graded by hand with "
                                                 f"rubric.md. " + ("Not answered." if blank else
                                                                   "The answer:\n" + text)))
        elif q.gpu and not gpu:
            entry.update(max_score=0.0, output=f"not graded on this machine: it needs a CUDA device "
                                               f"(worth {q.points:g} points when graded on one)")
        elif q.kind == "answer":
            rec = got_answers.get(q.name)
            if rec is None or "error" in rec:
                entry["output"] = "no answer: its cell did not run" + (f" ({rec['error']})" if rec else "")
            else:
                verdict = built[q.name].check(rec["value"])
                entry.update(score=q.points if verdict.correct else 0.0, output=str(verdict))
        else:
            entry.update(grade_implement(unwrap(built[q.name]), got_outputs.get(q.name), q.points))
        if q.kind != "written" and entry["score"]:
            bypass = bypasses(nb, master, q)
            if bypass:
                entry.update(score=0.0, output=f"0 points: {bypass}. " + entry.get("output", ""))
        tests.append(entry)
    score = round(sum(t["score"] for t in tests), 2)
    elapsed = time.perf_counter() - t0
    summary = f"{stem}: {score:g} of {sum(q.points for q in qs if q.kind != 'written'):g} autograded points"
    if note:
        summary += f"; {note}"
    return {"score": score, "execution_time": round(elapsed, 1), "output": summary, "tests": tests,
            "extra_data": {"notebook": stem, "student_id": sid, "seconds": round(elapsed, 1)}}


# what reads a reference answer out of an exercise object instead of computing it
_REVEALS = re.compile(r"\.solution\s*\(|\b_solution\b|\.exercise\b|__closure__|\b_diagnose\b|\.reference\b")


def bypasses(nb, master, q: Question) -> str:
    """Why a submission's answer to ``q`` does not count (empty when nothing says so): a code cell of
    the submission that asks an exercise object for its answer (``.solution()``, ``._solution``, the
    checker's closure), or, in the graded cell, a name its master cell forbids
    (``course:forbid:<name>``, e.g. the simulator an implement-it asks the student to rewrite). Cells
    identical to one of the master's are the instructor's own and pass."""
    kind = "answer" if q.kind == "answer" else "implement"
    forbidden = {a[0] for a in tag_args(master.cells[q.cell], "forbid") if a}
    own = {c.source for c in master.cells if c.cell_type == "code"}  # the instructor's own run
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.metadata.get("course_grader") or cell.source in own:
            continue
        found = _REVEALS.search(cell.source)
        if found and (re.search(rf"\b{re.escape(q.name)}\b", cell.source) or
                      any(a and a[0] == q.name for a in tag_args(cell, kind))):
            return f"cell {i} reads the answer out of an exercise object ({found.group(0).strip()!r})"
        if any(a and a[0] == q.name for a in tag_args(cell, kind)):
            used = sorted(forbidden & set(re.findall(r"[A-Za-z_]\w*", cell.source)))
            if used:
                return f"the graded cell uses {used}, which computes the answer: write it yourself"
    return ""


def grade_implement(task, outputs: list[dict] | None, points: float) -> dict:
    if outputs is None:
        return {"output": "its cell did not run to the end"}
    if outputs and outputs[0].get("not_implemented"):
        return {"output": f"{task.name}: not implemented yet"}
    right, first_wrong = 0, ""
    for i, (case, out) in enumerate(zip(task.cases, outputs, strict=False)):
        expected = expected_output(task, case)
        if "error" in out:
            ok, got = False, f"raised {out['error']}"
        else:
            try:
                ok = bool(task.same(out["value"], expected))
            except Exception:
                ok = False
            got = _short(out["value"])
        right += ok
        if not ok and not first_wrong:
            args = (", ".join(f"{k}={_short(v, 60)}" for k, v in case.items()) if isinstance(case, dict)
                    else _short(case, 120))
            explain = getattr(task, "explain", None)  # a task that judges properties says which broke
            if explain is not None and "error" not in out:
                first_wrong = f" First wrong: case {i} ({args}): {explain(out['value'], expected)}."
            else:
                first_wrong = f" First wrong: case {i} ({args}): got {got}, expected {_short(expected)}."
    total = len(task.cases)
    return {"score": round(points * right / total, 2),
            "output": f"{task.name}: {right} of {total} cases right (cases seeded by your id).{first_wrong}"}

"""The course in a classroom: build the student and autograder releases, and grade one submission.

    python scripts/course.py release --out DIR
    python scripts/course.py grade --release DIR [--student-id ID] SUBMISSION.ipynb > results.json

The notebooks in notebooks/ are the masters: they hold the solutions and run under nbval as they are.
``release`` writes DIR/student/ (the notebooks to hand out, with a ``course_data/`` folder beside them)
and DIR/autograder/ (the masters, the rubric of the written questions, and ``autograder.zip`` for
Gradescope). ``grade`` runs a submission in a fresh Jupyter kernel, then checks its answers and
functions against the masters' exercises rebuilt for the student's id, and prints Gradescope's
results.json (``score``, ``tests`` with ``name``, ``score``, ``max_score``, ``output``) on stdout.
Only notebooks with at least one ``course:`` tag are released.

How a master marks what the releases do (cell tags; a cell can carry several):

- ``course:student-id``: the first code cell. It sets ``STUDENT_ID``, which seeds every question
  (``simulators.classroom.student_seed(STUDENT_ID, name)``); the grader sets it to the student's id.
- ``course:answer:<ex>``: the cell that puts the answer to exercise ``<ex>`` in ``my_answer``. ``<ex>``
  is the name a code cell of the master assigns the exercise to, e.g.
  ``ex1 = hinted(paging_exercises.make_exercise(seed=student_seed(STUDENT_ID, "ex1")))``; the grader
  rebuilds it from that statement (with the imports of the master and the functions of that cell) for
  the student's id, and calls its ``check``. 1 point unless ``course:points:<n>``.
- ``course:implement:<task>:<function>``: the implement-it cell that defines ``<function>``. ``<task>``
  is assigned like an exercise; the grader rebuilds it for the student's id (so its cases are not the
  practice cases) and runs the student's function on its cases in the student's kernel; the reference
  runs in the grader only. The points (default 3) are shared over the cases.
  A task with a ``driver`` (``"module:function"``, e.g. ``simulators.graph_replay:observe``) runs the
  student's function as ``driver(function, case)`` in the student's kernel, for a function that acts on
  a world rather than returning a value (notebook 05's replay into static buffers); the driver's
  records are compared with ``task.expected(case)``, computed in the grader.
- ``course:forbid:<name>`` on an answer or implement-it cell: a submission whose graded cell uses
  ``<name>`` (the simulator or runner class that is the implement-it's reference) gets 0 for it, and
  says why. Any code cell that reads an exercise's answer out of its object (``.solution()``,
  ``._solution``, the checker's closure) voids the answers it names, the same way; cells identical to
  the master's are the instructor's own run and pass.
- ``course:written:<q>``: the markdown cell a student writes the answer to written question ``<q>`` in;
  the question is the markdown above it. Manual grading: the grader copies the answer into its output.
- ``course:rubric:<q>:<points>``: the rubric of written question ``<q>``; in the autograder release
  (``rubric.md``), never in the student's.
- ``gpu`` (the nbval tag) on an answer or implement-it cell: without CUDA the grader reports
  "not graded on this machine" with 0 of 0 points, never a zero out of its points.

Inside code cells, three line markers say what the student release keeps (anything else is kept):

- the lines from ``# BEGIN SOLUTION`` to ``# END SOLUTION`` are removed;
- a line ending in ``# SOLUTION`` is removed;
- ``# STUB: <code>`` becomes ``<code>`` at the same indentation (in the master it is a comment).

An implement-it's body is a solution block followed by ``# STUB: raise NotImplementedError``; in the
student release its check runs on practice cases whose expected outputs are data
(``simulators.classroom.practice_task``), so the student's notebook imports no reference. ``release``
refuses to write a student notebook in which a scan finds a ``.solution(`` call, a marker left over, a
name that only solution code uses, an implement-it body that is not a stub, or an output.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import course_grading  # noqa: E402  (scripts/ is not a package)

from simulators.classroom import PRACTICE_DIR, to_literal  # noqa: E402

MASTERS = ROOT / "notebooks"
PRACTICE_ID = "practice"
_BEGIN, _END, _SOLUTION, _STUB = "# BEGIN SOLUTION", "# END SOLUTION", "# SOLUTION", "# STUB:"
_WORD = re.compile(r"[A-Za-z_]\w*")


def split_source(source: str) -> tuple[str, str]:
    """(the student's code, the solution code removed from it) of one master cell.

    Raises ValueError on a marker that is misspelt or unbalanced, so a typo never leaks a solution."""
    kept, removed, inside = [], [], False
    for n, line in enumerate(source.split("\n"), 1):
        stripped = line.strip()
        comment = line.split("#", 1)[1] if "#" in line else ""
        if stripped == _BEGIN:
            if inside:
                raise ValueError(f"line {n}: {_BEGIN} inside a solution block")
            inside = True
        elif stripped == _END:
            if not inside:
                raise ValueError(f"line {n}: {_END} without {_BEGIN}")
            inside = False
        elif inside:
            removed.append(line)
        elif stripped.startswith(_STUB):
            indent = line[: len(line) - len(line.lstrip())]
            kept.append(indent + stripped[len(_STUB):].strip())
        elif line.rstrip().endswith(_SOLUTION) and not stripped.startswith("#"):
            removed.append(line)
        elif "SOLUTION" in comment:
            raise ValueError(f"line {n}: unknown marker {line.strip()!r} (use {_BEGIN}, {_END}, "
                             f"a trailing {_SOLUTION} or {_STUB})")
        else:
            kept.append(line)
    if inside:
        raise ValueError(f"{_BEGIN} without {_END}")
    return "\n".join(kept), "\n".join(removed)


def is_covered(nb) -> bool:
    return any(t.startswith("course:") for c in nb.cells for t in c.metadata.get("tags", []))


def masters() -> list[Path]:
    return [p for p in sorted(MASTERS.glob("[0-9][0-9]_*.ipynb")) if is_covered(nbformat.read(p, 4))]


def student_notebook(master, stem: str):
    """The student release of one master notebook (a new notebook; the master is not changed)."""
    nb = copy.deepcopy(master)
    nb.cells = [c for c in nb.cells if not course_grading.tag_args(c, "rubric")]
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.source = split_source(cell.source)[0].lstrip("\n")  # no blank lines where a solution began
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nb.metadata["course"] = {"notebook": stem}
    return nb


def scan_student(nb, master) -> list[str]:
    """What in a student notebook gives a solution away (empty when nothing does)."""
    problems = []
    kept_words, solution_words = set(), set()
    for cell in master.cells:
        if cell.cell_type == "code":
            kept, removed = split_source(cell.source)
            kept_words |= set(_WORD.findall(kept))
            solution_words |= set(_WORD.findall(removed))
    only_solution = solution_words - kept_words
    for i, cell in enumerate(nb.cells):
        if course_grading.tag_args(cell, "rubric"):
            problems.append(f"cell {i}: a rubric")
        if cell.cell_type != "code":
            continue
        src = cell.source
        if re.search(r"\.solution\(", src):
            problems.append(f"cell {i}: a .solution() call")
        if "SOLUTION" in src or _STUB in src:
            problems.append(f"cell {i}: a solution marker left over")
        leaked = sorted(only_solution & set(_WORD.findall(src)))
        if leaked:
            problems.append(f"cell {i}: names only solution code uses: {leaked}")
        if cell.get("outputs"):
            problems.append(f"cell {i}: outputs (they may print a reference)")
        for _task, function in course_grading.tag_args(cell, "implement", 2):
            if not course_grading.is_stub(src, function):
                problems.append(f"cell {i}: {function}'s body is not a stub raising NotImplementedError")
    return problems


def practice_data(master) -> dict:
    """The practice cases of every implement-it of a master, with expected outputs (data only)."""
    tasks = {}
    for cell in master.cells:
        for task_name, _function in course_grading.tag_args(cell, "implement", 2):
            task = course_grading.unwrap(course_grading.build(master, task_name, PRACTICE_ID))
            tasks[task_name] = {
                "name": task.name, "hint": task.hint, "cases": [to_literal(c) for c in task.cases],
                "expected": [to_literal(course_grading.expected_output(task, c)) for c in task.cases]}
            if getattr(task, "driver", None):
                tasks[task_name]["driver"] = task.driver
            if getattr(task, "judge", None):  # judges properties: problem(got, expected) -> str | None
                tasks[task_name]["judge"] = task.judge
    return {"tasks": tasks}


def rubric_text(master, stem: str) -> str:
    lines = [f"## {stem}", ""]
    for i, cell in enumerate(master.cells):
        for q, points in course_grading.tag_args(cell, "rubric", 2):
            question = course_grading.question_above(master, i, q)
            lines += [f"### {stem} {q} ({points} points)", "", "**Question.** " + question, "",
                      cell.source.strip(), ""]
    return "\n".join(lines)


GRADESCOPE_SETUP = """#!/usr/bin/env bash
# Gradescope runs this once to build the autograder image (Ubuntu, Python 3.10 or newer).
set -euo pipefail
cd /autograder/source
pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
pip install "torch==2.13.0" -e ".[course,notebooks]"
"""

GRADESCOPE_RUN = """#!/usr/bin/env bash
# Gradescope runs this per submission; results.json goes where Gradescope reads it.
set -euo pipefail
cd /autograder/source
SID=$(python -c "import json; u = json.load(open('/autograder/submission_metadata.json'))['users'][0]; \\
print(u.get('sid') or u['email'])")
for nb in /autograder/submission/*.ipynb; do
  python scripts/course.py grade --release release --student-id "$SID" "$nb" \\
    > /autograder/results/results.json
  break
done
"""


def gradescope_zip(path: Path, autograder: Path) -> None:
    """Gradescope's autograder zip: setup.sh, run_autograder, the package sources, this script and the
    autograder release (masters, practice data)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("setup.sh"), GRADESCOPE_SETUP)
        z.writestr(zipfile.ZipInfo("run_autograder"), GRADESCOPE_RUN)
        for name in ("setup.sh", "run_autograder"):
            z.getinfo(name).external_attr = 0o755 << 16
        for rel in ("pyproject.toml", "README.md", "scripts/course.py", "scripts/course_grading.py"):
            z.write(ROOT / rel, rel)
        for package in ("minirunner", "simulators"):
            for f in sorted((ROOT / package).rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".so", ".pyc"):
                    z.write(f, str(f.relative_to(ROOT)))
        for f in sorted(autograder.rglob("*")):
            if f.is_file() and f.suffix != ".zip":
                z.write(f, str(Path("release/autograder") / f.relative_to(autograder)))


def release(out: Path) -> None:
    student, autograder = out / "student", out / "autograder"
    for d in (student, autograder):
        if d.exists():
            shutil.rmtree(d)
    for d in (student / PRACTICE_DIR, autograder / "masters", autograder / PRACTICE_DIR):
        d.mkdir(parents=True)
    rubric = ["# Rubric of the written questions (autograder release only)", ""]
    for path in masters():
        master, stem = nbformat.read(path, 4), path.stem
        nb = student_notebook(master, stem)
        problems = scan_student(nb, master)
        if problems:
            raise SystemExit(f"{path.name}: the student release would give solutions away: {problems}")
        nbformat.write(nb, student / path.name)
        data = json.dumps(practice_data(master), indent=1)
        for d in (student, autograder):
            (d / PRACTICE_DIR / f"{stem}.json").write_text(data + "\n")
        shutil.copy(path, autograder / "masters" / path.name)
        rubric.append(rubric_text(master, stem))
        questions = course_grading.questions(master)
        print(f"{path.name}: {len(questions)} graded questions, "
              f"{sum(q.points for q in questions if q.kind != 'written')} autograded points",
              file=sys.stderr)
    (autograder / "rubric.md").write_text("\n".join(rubric))
    gradescope_zip(autograder / "autograder.zip", autograder)
    print(f"student release: {student}\nautograder: {autograder} (autograder.zip for Gradescope, "
          f"rubric.md)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("release", help="build DIR/student and DIR/autograder from notebooks/")
    r.add_argument("--out", type=Path, required=True)
    g = sub.add_parser("grade", help="grade one submission; print Gradescope's results.json")
    g.add_argument("--release", type=Path, required=True, help="the DIR given to `release --out`")
    g.add_argument("--student-id", help="whose problems to grade (default: the notebook's STUDENT_ID)")
    g.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    g.add_argument("notebook", type=Path)
    args = parser.parse_args(argv)
    if args.command == "release":
        release(args.out)
        return 0
    results = course_grading.grade(args.release, args.notebook, args.student_id, args.timeout)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

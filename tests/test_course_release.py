"""The course in a classroom: the student release gives no solution away, and the autograder grades the
property (per-student problems, committed wrong answers lose points, valid alternatives earn them).

Runs scripts/course.py as an instructor does (real Jupyter kernels through nbclient). The slow test
builds both releases and grades the master, the untouched student release, the mutants and the
alternatives of tests/course_mutants/ for every notebook in COVERED.
"""

from __future__ import annotations

import copy
import importlib
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import course  # noqa: E402
import course_grading  # noqa: E402

from simulators import block_exercises  # noqa: E402
from simulators.classroom import student_seed, to_literal  # noqa: E402

COVERED = {"01_virtual_memory": "nb01", "02_kv_cache_memory": "nb02", "03_block_tables": "nb03",
           "04_launch_overhead": "nb04", "05_cuda_graphs": "nb05", "06_speculative_decoding": "nb06",
           "07_model_runner_v2": "nb07", "09_serving_under_load": "nb09"}
STUDENT = "s000"
# names of the reference implementations and of what builds the graded tasks: never in a student notebook
REFERENCES = ("translate_ptes", "BlockTable", "runner_slot_mapping", "make_translate_task",
              "slot_mapping_task", "runner_blocks_needed", "blocks_needed_task", "make_step_time_task",
              "make_floor_task", "runner_rows", "make_replay_task", "StepBuffers")


def _mutants(stem: str):
    return importlib.import_module(f"tests.course_mutants.{COVERED[stem]}")


def _master(stem: str):
    return nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", 4)


def test_markers_remove_solutions_and_refuse_a_typo():
    student, removed = course.split_source(
        "x = 1  # SOLUTION\n# STUB: x = None\ndef f():\n    # BEGIN SOLUTION\n    return 2\n"
        "    # END SOLUTION\n    # STUB: raise NotImplementedError\nprint(x)")
    assert student == "x = None\ndef f():\n    raise NotImplementedError\nprint(x)"
    assert "return 2" in removed and "x = 1" in removed
    for bad in ("# BEGIN SOLUTON\nsecret = 1\n# END SOLUTION", "# BEGIN SOLUTION\nsecret = 1",
                "secret = 1  # SOLUTIONS"):
        with pytest.raises(ValueError):
            course.split_source(bad)


def test_each_student_gets_own_problem_and_the_grader_rebuilds_it():
    assert student_seed("jdoe", "ex1") == student_seed(" jdoe ", "ex1")
    assert len({student_seed(f"s{i:03d}", "ex1") for i in range(200)}) == 200
    with pytest.raises(ValueError, match="STUDENT_ID"):
        student_seed("", "ex1")
    master = _master("01_virtual_memory")
    questions = {course_grading.build(master, "ex1", f"s{i:03d}").question for i in range(20)}
    assert len(questions) >= 15  # not one problem (and one number) for the whole class


@pytest.mark.parametrize("stem", sorted(COVERED))
def test_one_hint_policy_no_method_before_a_real_attempt(stem):
    """Unanswered or malformed: no hint. Wrong: the hint. The graded exercises of 01 and 03, 20 ids."""
    master = _master(stem)
    for q in course_grading.questions(master):
        if q.kind != "answer":
            continue
        for sid in (f"s{i:03d}" for i in range(20)):
            ex = course_grading.build(master, q.name, sid)
            hint = ex.exercise.hint
            for untouched in (None, "", {"not": "an answer"}):
                verdict = ex.check(untouched)
                assert not verdict.correct and hint not in str(verdict), (q.name, sid, str(verdict))
            wrong = next(v for v in _wrong_answers(ex.exercise.solution()) if ex.check(v).answered
                         and not ex.check(v).correct)
            assert str(ex.check(wrong)).endswith("Hint: " + hint), (q.name, sid, str(ex.check(wrong)))


def _wrong_answers(solution):
    if isinstance(solution, str):
        return ["z", "page fault", "segfault", "fault", "mmmmmmmmmm", "a", "b", 0, 1, "kernel",
                "abstraction", "memory model"]
    if isinstance(solution, float):
        return [solution * 2 + 1, solution + 1]
    if isinstance(solution, int):
        return [solution + 1, solution - 1, 2 * solution + 7]
    return [[int(x) + 1 for x in solution], (0, 0), (1, 1)]


@pytest.mark.parametrize("stem", sorted(COVERED))
def test_mutants_lose_and_alternatives_win_across_students(stem):
    """In this process, over 100 student ids: each wrong method loses the point on most problems (it
    can be right by coincidence on a problem that does not tell it apart), each valid one on none."""
    master, mod = _master(stem), _mutants(stem)
    ids = [f"s{i:03d}" for i in range(100)]
    implements = {q.name for q in course_grading.questions(master) if q.kind == "implement"}
    for kind, table in (("mutant", mod.MUTANTS), ("alternative", mod.ALTERNATIVES)):
        for q, sources in table.items():
            if q in implements:
                continue  # implement-its: the in-process test below and the slow test
            exercises = {sid: course_grading.build(master, q, sid) for sid in ids}
            for k, src in enumerate(sources):
                if "run_problem" in src or "make_llm" in src:
                    continue  # runs the real runner: through the grader only
                full = 0
                for sid in ids:
                    ex = exercises[sid]
                    ns = {q: ex, "STUDENT_ID": sid, "block_exercises": block_exercises}
                    exec(src, ns)
                    full += ex.check(to_literal(ns["my_answer"])).correct
                if kind == "mutant":
                    assert full <= 25, f"{stem} {q} mutant {k} earns the point for {full} of 100 students"
                else:
                    assert full == 100, f"{stem} {q} alternative {k} loses for {100 - full} students"


def _outputs(task, fn) -> list[dict]:
    """What the grader collects in the student's kernel, collected here: one output per case."""
    out = []
    for case in task.cases:
        try:
            if getattr(task, "driver", None):
                module, attr = task.driver.split(":")
                drive = getattr(importlib.import_module(module), attr)  # a dict case is keyword arguments
                value = drive(fn, **case) if isinstance(case, dict) else drive(fn, case)
            else:
                value = fn(**case)
            out.append({"value": to_literal(value)})
        except Exception as e:
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


@pytest.mark.parametrize("stem", sorted(COVERED))
def test_implement_mutants_lose_and_alternatives_win_in_process(stem):
    """Each implement-it, for 3 student ids, scored as the grader scores it (its cases, its comparison,
    the names its master forbids): every mutant loses points, every alternative earns them all."""
    import numpy as np
    import torch

    from simulators.launch import simulate

    master, mod = _master(stem), _mutants(stem)
    for q in (q for q in course_grading.questions(master) if q.kind == "implement"):
        for sid in ("s000", "s001", "s002"):
            task = course_grading.unwrap(course_grading.build(master, q.name, sid))
            for kind, sources in (("mutant", mod.MUTANTS[q.name]), ("alternative", mod.ALTERNATIVES[q.name])):
                for k, src in enumerate(sources):
                    ns = {"torch": torch, "np": np, "simulate": simulate}
                    exec(src, ns)
                    got = course_grading.grade_implement(task, _outputs(task, ns[q.function]), q.points)
                    submission = _replace(course.student_notebook(master, stem), {q.name: src})
                    score = 0.0 if course_grading.bypasses(submission, master, q) else got["score"]
                    if kind == "mutant":
                        assert score < q.points, f"{stem} {q.name} mutant {k} ({sid}) kept its points: {got}"
                    else:
                        assert score == q.points, f"{stem} {q.name} alternative {k} ({sid}): {got}"


@pytest.mark.parametrize("stem", sorted(COVERED))
def test_practice_checks_in_the_student_release_agree_with_the_grader(stem, tmp_path, monkeypatch):
    """The student's own check (expected outputs as data, no reference) accepts every alternative and
    rejects every mutant of each implement-it, with the hint only after that wrong attempt."""
    import numpy as np
    import torch

    from simulators.classroom import PRACTICE_DIR, practice_task
    from simulators.launch import simulate

    master, mod = _master(stem), _mutants(stem)
    (tmp_path / PRACTICE_DIR).mkdir()
    (tmp_path / PRACTICE_DIR / f"{stem}.json").write_text(json.dumps(course.practice_data(master)))
    for q in (q for q in course_grading.questions(master) if q.kind == "implement"):
        task = practice_task(stem, q.name, tmp_path)
        for kind, sources in (("mutant", mod.MUTANTS[q.name]), ("alternative", mod.ALTERNATIVES[q.name])):
            for k, src in enumerate(sources):
                if course_grading.bypasses(_replace(course.student_notebook(master, stem), {q.name: src}),
                                           master, q):
                    continue  # right, but uses a forbidden reference: only the grader says so
                ns = {"torch": torch, "np": np, "simulate": simulate}
                exec(src, ns)
                verdict = task.check(ns[q.function])
                if kind == "mutant":
                    assert verdict.answered and not verdict.correct and "Hint:" in verdict.why, (q.name, k)
                else:
                    assert verdict.correct, (stem, q.name, k, verdict.why)


def test_reading_the_answer_out_of_an_exercise_earns_nothing():
    """A submission that asks an exercise object for its answer, in any cell, gets no point for it."""
    master = _master("02_kv_cache_memory")
    q = next(q for q in course_grading.questions(master) if q.name == "ex1")
    student = course.student_notebook(master, "02_kv_cache_memory")
    honest = _replace(student, {"ex1": "my_answer = 12"})
    assert course_grading.bypasses(honest, master, q) == ""
    for cheat in ("my_answer = ex1.solution()", "my_answer = ex1.exercise._solution",
                  "my_answer = ex1.exercise._diagnose.__closure__[0].cell_contents"):
        assert "exercise object" in course_grading.bypasses(_replace(student, {"ex1": cheat}), master, q)
    elsewhere = copy.deepcopy(honest)
    elsewhere.cells.append(nbformat.v4.new_code_cell("x = ex1.solution()"))
    assert "exercise object" in course_grading.bypasses(elsewhere, master, q)
    assert course_grading.bypasses(master, master, q) == ""  # the instructor's own master
    for stem in COVERED:  # nothing a student release shows is read as a bypass
        master = _master(stem)
        student = course.student_notebook(master, stem)
        assert all(course_grading.bypasses(student, master, q) == "" for q in course_grading.questions(master)
                   if q.kind != "written")


def _grade(release: Path, notebook: Path, sid: str = STUDENT) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "course.py"), "grade", "--release",
                          str(release), "--student-id", sid, str(notebook)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout)
    for t in results["tests"]:
        assert {"name", "score", "max_score", "output"} <= set(t)
    print(f"graded {notebook.parent.name}/{notebook.name}: {results['score']:g} points in "
          f"{results['execution_time']:.0f} s")
    return results


def _by_question(results: dict, stem: str) -> dict:
    return {t["name"].split(":")[0].split(" ", 1)[1]: t for t in results["tests"]
            if t["name"].startswith(stem)}


def _replace(student, replacements: dict):
    nb = copy.deepcopy(student)
    for cell in nb.cells:
        for args in course_grading.tag_args(cell, "answer") + course_grading.tag_args(cell, "implement"):
            if args and args[0] in replacements:
                cell.source = replacements[args[0]]
    return nb


def test_gpu_question_is_not_graded_without_cuda(tmp_path):
    """A question tagged gpu is reported "not graded on this machine", 0 of 0 points, never 0 of 1."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the question is graded")
    cells = [nbformat.v4.new_code_cell('STUDENT_ID = "x"\n'
                                       'from simulators.kv_exercises import make_slot_exercise'),
             nbformat.v4.new_code_cell('ex1 = make_slot_exercise(seed=7)'),
             nbformat.v4.new_code_cell("my_answer = 1")]
    cells[0].metadata["tags"] = ["course:student-id"]
    cells[2].metadata["tags"] = ["course:answer:ex1", "gpu"]
    nb = nbformat.v4.new_notebook(cells=cells)
    (tmp_path / "autograder" / "masters").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "autograder" / "masters" / "99_gpu_demo.ipynb")
    nbformat.write(nb, tmp_path / "99_gpu_demo.ipynb")
    test = _grade(tmp_path, tmp_path / "99_gpu_demo.ipynb")["tests"][-1]
    assert (test["score"], test["max_score"]) == (0.0, 0.0)
    assert "not graded on this machine" in test["output"]


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(COVERED))
def test_releases_and_grading_end_to_end(tmp_path, stem):
    """Per notebook: the master earns full marks, the blank release none, every mutant loses, every
    alternative earns all. Prints one line per submission graded (score, seconds): run with -s."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "course.py"), "release", "--out", str(tmp_path)],
                   check=True, cwd=ROOT, capture_output=True, timeout=300)
    student_dir, autograder = tmp_path / "student", tmp_path / "autograder"
    assert (autograder / "autograder.zip").is_file()
    rubric = (autograder / "rubric.md").read_text()
    master = _master(stem)
    student = nbformat.read(student_dir / f"{stem}.ipynb", 4)
    code = "\n".join(c.source for c in student.cells if c.cell_type == "code")
    text = "\n".join(c.source for c in student.cells)
    assert ".solution(" not in code and "SOLUTION" not in code
    references = getattr(_mutants(stem), "REFERENCES", REFERENCES)  # a mutants module may name its own
    assert not [r for r in references if r in code], "a reference implementation in the student release"
    assert "Rubric" not in text and "Rubric" in rubric
    assert course.scan_student(student, master) == []
    written = [c for c in student.cells if course_grading.tag_args(c, "written")]
    assert len(written) >= 2

    qs = {q.name: q for q in course_grading.questions(master) if q.kind != "written"}
    full = sum(q.points for q in qs.values())
    m = _grade(tmp_path, ROOT / "notebooks" / f"{stem}.ipynb")
    assert m["score"] == full, m
    blank = _by_question(_grade(tmp_path, student_dir / f"{stem}.ipynb"), stem)
    assert all(blank[n]["score"] == 0 for n in qs)
    assert all("not implemented yet" in blank[n]["output"]
               for n, q in qs.items() if q.kind == "implement")

    mod = _mutants(stem)
    for k in range(max(len(v) for v in mod.MUTANTS.values())):
        wrong = {q: v[k] for q, v in mod.MUTANTS.items() if k < len(v)}
        got = _by_question(_grade(tmp_path, _write(tmp_path, _replace(student, wrong), f"m{k}")), stem)
        for q in wrong:
            assert got[q]["score"] < qs[q].points, f"{stem} mutant {k} of {q} kept its points: {got[q]}"
    for j in range(2):
        right = {q: v[j] for q, v in mod.ALTERNATIVES.items()}
        got = _by_question(_grade(tmp_path, _write(tmp_path, _replace(student, right), f"a{j}")), stem)
        for q in right:
            assert got[q]["score"] == qs[q].points, f"{stem} alternative {j} of {q} lost points: {got[q]}"


def _write(folder: Path, nb, name: str) -> Path:
    stem = nb.metadata["course"]["notebook"]
    path = folder / name / f"{stem}.ipynb"
    path.parent.mkdir(exist_ok=True)
    nbformat.write(nb, path)
    return path

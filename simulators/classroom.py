"""What a notebook needs in a classroom: a per-student seed, and implement-it checks from data.

Owns ``student_seed`` (a student id and a question name give the same seed here, in the student's
notebook and in the autograder) and ``practice_task`` (an implement-it whose expected outputs are read
from a data file written by ``scripts/course.py release``, so the student release holds no reference
implementation). It never holds a solution; the grading itself lives in ``scripts/course_grading.py``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulators.exercises import ImplementIt, Verdict
from simulators.hinted_exercises import HintedTask

# where the student release keeps the practice cases of its implement-its, beside the notebooks
PRACTICE_DIR = "course_data"


def student_seed(student_id: str, question: str) -> int:
    """The seed of one question for one student: a hash of both, so no two students share a problem
    and the autograder recomputes the same one. ``student_id`` must be a non-empty string."""
    if not isinstance(student_id, str) or not student_id.strip():
        raise ValueError("STUDENT_ID must be your student id as a non-empty string, e.g. "
                         "STUDENT_ID = \"jdoe\"; set it in the notebook's first code cell")
    digest = hashlib.sha256(f"{student_id.strip()}/{question}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1_000_000


def to_literal(value: Any) -> Any:
    """``value`` as plain Python literals (numpy and torch scalars and arrays become ints, floats and
    lists), so that an answer or a function's output can travel as text and be compared."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        out = [to_literal(v) for v in value]
        return tuple(out) if isinstance(value, tuple) else out
    if isinstance(value, dict):
        return {to_literal(k): to_literal(v) for k, v in value.items()}
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return to_literal(value.tolist())
    if hasattr(value, "item"):
        return to_literal(value.item())
    return repr(value)


def close(got: Any, want: Any, rel: float = 1e-6) -> bool:
    """Whether two plain values are equal, floats to ``rel`` (relative, or absolute near 0): a float
    computed in another order differs in its last bits. Ints, strings and shapes compare exactly."""
    if isinstance(got, bool) or isinstance(want, bool):
        return got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        if isinstance(got, int) and isinstance(want, int):
            return got == want
        return math.isclose(got, want, rel_tol=rel, abs_tol=rel)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(close(g, w, rel) for g, w in zip(got, want, strict=True))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(close(got[k], want[k], rel) for k in got)
    return got == want


def practice_task(notebook: str, task: str, folder: str | Path = ".") -> HintedTask:
    """The implement-it ``task`` of ``notebook`` in the student release: the same cases for every
    student, with the expected outputs as data (``course_data/<notebook>.json``). The hint comes after
    a wrong attempt. Graded submissions are checked on other cases, seeded per student."""
    path = Path(folder) / PRACTICE_DIR / f"{notebook}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: keep the course_data folder of the student "
                                "release beside this notebook")
    spec = json.loads(path.read_text())["tasks"][task]
    expected = {json.dumps(case, sort_keys=True): out for case, out in zip(spec["cases"], spec["expected"],
                                                                           strict=True)}

    if spec.get("driver"):
        return HintedTask(DrivenPractice(spec["name"], spec["driver"], spec["cases"], spec["expected"],
                                         spec["hint"], spec.get("judge", "")))

    def reference(**case):
        return expected[json.dumps(case, sort_keys=True)]

    def same(got, want) -> bool:  # through JSON, as the expected outputs were stored: tuples are lists
        return close(json.loads(json.dumps(to_literal(got))), want)

    return HintedTask(ImplementIt(spec["name"], reference, spec["cases"], same=same, hint=spec["hint"]))


def _import(path: str) -> Any:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class DrivenPractice:
    """A practice implement-it whose cases run through a driver (``"module:function"``, called as
    ``driver(fn, case)``: e.g. a toy world the student's function writes into) and whose expected
    records are data. A ``judge`` (``"module:function"``, ``judge(got, want) -> str | None``) or else
    the driver's module's ``compare`` says where a record differs; otherwise records are compared as
    JSON. A dict case is the driver's keyword arguments, any other case one argument."""

    name: str
    driver: str
    cases: list
    expected: list
    hint: str
    judge: str = ""

    def check(self, fn: Callable[..., Any]) -> Verdict:
        drive = _import(self.driver)
        module = importlib.import_module(self.driver.split(":")[0])
        compare = _import(self.judge) if self.judge else getattr(module, "compare", None)
        for i, (case, want) in enumerate(zip(self.cases, self.expected, strict=True)):
            try:
                value = drive(fn, **case) if isinstance(case, dict) else drive(fn, case)
                got = json.loads(json.dumps(to_literal(value)))
            except NotImplementedError:
                return Verdict(False, f"{self.name}: {self.hint}", answered=False,
                               pending="not implemented yet")
            except Exception as e:  # a student's bug is a verdict, not a crash of the notebook
                return Verdict(False, f"case {i} raised {type(e).__name__}: {e}")
            wrong = compare(got, want) if compare else (None if got == want else "the records differ")
            if wrong:
                return Verdict(False, f"case {i}, {wrong}")
        return Verdict(True, f"{self.name} agrees with the runner on all {len(self.cases)} practice cases")

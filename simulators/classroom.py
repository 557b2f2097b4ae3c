"""What a notebook needs in a classroom: a per-student seed, and implement-it checks from data.

Owns ``student_seed`` (a student id and a question name give the same seed here, in the student's
notebook and in the autograder) and ``practice_task`` (an implement-it whose expected outputs are read
from a data file written by ``scripts/course.py release``, so the student release holds no reference
implementation). It never holds a solution; the grading itself lives in ``scripts/course_grading.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from simulators.exercises import ImplementIt
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


def _close(got: Any, want: Any) -> bool:
    """Equal, with floats equal to 1e-9 relative (a float computed another way may differ in its last
    bits); ints, strings and the structure must match exactly."""
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
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

    def reference(**case):
        return expected[json.dumps(case, sort_keys=True)]

    def same(got, want) -> bool:  # through JSON, as the expected outputs were stored: tuples are lists
        return _close(json.loads(json.dumps(to_literal(got))), want)

    return HintedTask(ImplementIt(spec["name"], reference, spec["cases"], same=same, hint=spec["hint"]))

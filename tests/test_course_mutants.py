"""The committed mutants and alternatives of the implement-its, in this process: each mutant fails the
checker the autograder uses (built for several student ids), each alternative passes it.

The answers to numeric and choice exercises are tried in tests/test_course_release.py; the slow test
there runs all of them through the grader, in a real kernel.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import course_grading  # noqa: E402
from test_course_release import COVERED  # noqa: E402

from simulators.exercises import NotImplementedYet  # noqa: E402

IDS = ("s000", "s001", "s002")


def _implement_its(stem):
    master = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", 4)
    mod = importlib.import_module(f"tests.course_mutants.{COVERED[stem]}")
    for q in course_grading.questions(master):
        if q.kind == "implement" and q.name in mod.MUTANTS:
            yield master, q, mod


def _function(source: str, name: str):
    ns = {"np": np, "torch": torch, "NotImplementedYet": NotImplementedYet}
    exec(source, ns)
    return ns[name]


@pytest.mark.parametrize("stem", sorted(COVERED))
def test_implement_mutants_fail_and_alternatives_pass(stem):
    for master, q, mod in _implement_its(stem):
        for sid in IDS:
            task = course_grading.build(master, q.name, sid)
            for k, src in enumerate(mod.MUTANTS[q.name]):
                verdict = task.check(_function(src, q.function))
                assert verdict.answered and not verdict.correct, f"{stem} {q.name} mutant {k} passes: {sid}"
            for k, src in enumerate(mod.ALTERNATIVES[q.name]):
                verdict = task.check(_function(src, q.function))
                assert verdict.correct, f"{stem} {q.name} alternative {k} fails for {sid}: {verdict}"

"""The course's one hint policy: no method before a first real attempt, a hint after a wrong one.

Owns two thin wrappers over ``simulators.exercises``: an untouched exercise says only "not answered yet"
/ "not implemented yet" and how to try, never the method; an answer of the wrong form (a checker's
``Verdict(attempt=False)``, e.g. text where an int is asked) says only what form is expected; a wrong
attempt gets the checker's reason and then the hint. The checkers themselves (and how strict they
are) are the wrapped ones, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulators.exercises import Exercise, ImplementIt, Verdict

ASK = "put your answer in my_answer and run the cell again (a wrong attempt gets a hint)."
WRITE = "write the function body and run the cell again (a wrong attempt gets a hint)."


def _after_wrong(verdict: Verdict, hint: str, prompt: str, pending: str) -> Verdict:
    if not verdict.answered:
        return Verdict(False, prompt, answered=False, pending=pending)
    if not verdict.attempt:
        return Verdict(False, verdict.why, answered=False, pending="not an answer yet")
    if verdict.correct:
        return verdict
    return Verdict(False, f"{verdict.why.rstrip('.')}. Hint: {hint}")


@dataclass
class HintedExercise:
    """An Exercise whose ``hint`` is shown only after a wrong answer."""

    exercise: Exercise
    prompt: str = ASK

    @property
    def seed(self) -> int:
        return self.exercise.seed

    @property
    def question(self) -> str:
        return self.exercise.question

    def check(self, answer: Any) -> Verdict:
        return _after_wrong(self.exercise.check(answer), self.exercise.hint, self.prompt, "not answered yet")

    def solution(self) -> Any:
        return self.exercise.solution()

    def __str__(self) -> str:
        return str(self.exercise)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))


@dataclass
class HintedTask:
    """An implement-it (anything with ``check(fn) -> Verdict`` and a ``hint``) whose hint is shown only
    after a wrong implementation."""

    task: Any  # ImplementIt or a task with the same check/hint shape
    prompt: str = WRITE
    name: str = field(default="")

    def check(self, fn: Callable[..., Any]) -> Verdict:
        name = self.name or getattr(self.task, "name", "")
        prompt = f"{name}: {self.prompt}" if name else self.prompt
        return _after_wrong(self.task.check(fn), self.task.hint, prompt, "not implemented yet")

    @property
    def cases(self) -> list:
        return self.task.cases


def hinted(item: Exercise | ImplementIt | Any) -> HintedExercise | HintedTask:
    """The hint-after-a-wrong-attempt form of an exercise or an implement-it."""
    return HintedExercise(item) if isinstance(item, Exercise) else HintedTask(item)

"""Seeded exercises with a checker: a question, a hidden solution, and a verdict that says why.

Owns the ``Exercise``/``Verdict`` shapes every notebook uses; the topic modules build the questions.
It never prints a solution unless asked to (``Exercise.solution()``, or a simulator's ``-c``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """The checker's answer: right or wrong, and a sentence saying why."""

    correct: bool
    why: str
    answered: bool = True  # False: the learner has not replaced the placeholder ``None`` yet

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        if not self.answered:
            return "not answered yet: " + self.why
        return ("right: " if self.correct else "wrong: ") + self.why

    def _repr_pretty_(self, p, cycle) -> None:  # IPython display: the sentence, not the dataclass
        p.text(str(self))


@dataclass
class Exercise:
    """One seeded question: ``check(answer)`` gives a Verdict, ``solution()`` reveals the answer."""

    seed: int
    question: str
    _solution: Any = field(repr=False)
    _diagnose: Callable[[Any], Verdict] = field(repr=False)
    hint: str = ""  # what ``check(None)`` says: where to start, never the answer

    def check(self, answer: Any) -> Verdict:
        """Whether ``answer`` is right, and why (a wrong answer gets a hint, not the solution).
        ``None`` (the placeholder a notebook starts with) is "not answered yet" plus the hint."""
        if answer is None and self.hint:
            return Verdict(False, self.hint, answered=False)
        return self._diagnose(answer)

    def solution(self) -> Any:
        """The answer (the same one the simulator's ``-c`` flag prints for this seed)."""
        return self._solution

    def __str__(self) -> str:
        return f"Exercise (seed {self.seed})\n{self.question}"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

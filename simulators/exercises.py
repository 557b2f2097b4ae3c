"""Seeded exercises with a checker: a question, a hidden solution, and a verdict that says why.

Owns the ``Exercise``/``Verdict`` shapes every notebook uses; the topic modules build the questions.
It never prints a solution unless asked to (``Exercise.solution()``, or the simulator command in
``Exercise.command``), and an unanswered exercise is never called wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """The checker's answer: right, wrong, or not answered yet, and a sentence saying why."""

    correct: bool
    why: str
    answered: bool = True

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
    """One seeded question: ``check(answer)`` gives a Verdict, ``solution()`` reveals the answer.

    ``check(None)`` (the notebooks' placeholder) says "not answered yet" with ``hint``.
    ``command``, when set, is a simulator command line that prints this very problem; with ``-c``
    it prints the solution too (the tests check that they agree for many seeds).
    """

    seed: int
    question: str
    _solution: Any = field(repr=False)
    _diagnose: Callable[[Any], Verdict] = field(repr=False)
    hint: str = "work it out, put your answer in my_answer and run the cell again."
    command: str | None = None

    def check(self, answer: Any) -> Verdict:
        """Whether ``answer`` is right, and why (a wrong answer gets a hint, not the solution)."""
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            return Verdict(False, self.hint, answered=False)
        return self._diagnose(answer)

    def solution(self) -> Any:
        """The answer. Where ``command`` is set, the same answer that command's ``-c`` prints."""
        return self._solution

    def __str__(self) -> str:
        text = f"Exercise (seed {self.seed})\n{self.question}"
        if self.command:
            text += f"\n(the same problem from a shell: {self.command}; add -c for the answer)"
        return text

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))


def parse_int(answer: Any) -> int | None:
    """An int from an int or a decimal/hex string ("0x1f"); None when it is neither."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer
    if isinstance(answer, str):
        try:
            return int(answer.strip(), 0)
        except ValueError:
            return None
    return None

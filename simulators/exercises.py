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
    pending: str = "not answered yet"  # what an unanswered one says ("not implemented yet" for a stub)
    attempt: bool = True  # False when the answer's form is wrong (not an int...): no real attempt yet

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        if not self.answered:
            return f"{self.pending}: {self.why}"
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


def parse_choice(answer: Any, choices) -> str | None:
    """The letter of a multiple-choice answer ("b", " B ", "b) because ..." -> "b"), or None when its
    first character is not one of ``choices``."""
    choice = str(answer).strip().lower()[:1]
    return choice if choice and choice in choices else None


def choice_exercise(seed: int, rng, question: str, right: tuple[str, str], wrongs: list[tuple[str, str]],
                    wrong_suffix: str = "", **kwargs: Any) -> Exercise:
    """A multiple-choice Exercise: ``right`` and ``wrongs`` are (option, why) pairs, shuffled with ``rng``
    and lettered a, b, c...; an answer gets its option's why (``wrong_suffix`` appended to a wrong one's).
    ``kwargs`` go to Exercise (``hint``, ``command``)."""
    options = [right, *wrongs]
    rng.shuffle(options)
    letters = "abcdefgh"[:len(options)]
    answer_letter = letters[options.index(right)]
    listed = ", ".join(f'"{c}"' for c in letters[:-1]) + f' or "{letters[-1]}"'
    text = question + "\n" + "\n".join(f"({c}) {o[0]}" for c, o in zip(letters, options, strict=True)) + \
        f"\nAnswer {listed.replace(chr(34), '')}."
    why = dict(zip(letters, (o[1] for o in options), strict=True))

    def diagnose(answer) -> Verdict:
        choice = parse_choice(answer, letters)
        if choice is None:
            return Verdict(False, f"answer {listed}.", attempt=False)
        if choice == answer_letter:
            return Verdict(True, why[choice] + ".")
        return Verdict(False, why[choice] + wrong_suffix + ".")

    return Exercise(seed, text, answer_letter, diagnose, **kwargs)


def parse_float(answer: Any) -> float | None:
    """A number from anything ``float`` takes (an int, a float, a numeric string); None otherwise."""
    try:
        return float(answer)
    except (TypeError, ValueError):
        return None


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


class NotImplementedYet(NotImplementedError):
    """Raised by an untouched implement-it stub; the checker turns it into "not implemented yet"."""


@dataclass
class ImplementIt:
    """An implement-it task: the student writes a function; ``check(fn)`` runs it on seeded cases
    against a reference and says, for the first case that differs, what was passed, what came back and
    what was expected.

    ``cases`` are keyword-argument dicts for both functions. ``reference`` is passed in (a simulator never
    imports the runner: a notebook hands the runner's twin in as data). ``same(got, expected)`` compares
    two results (``==`` by default; pass e.g. ``torch.equal`` or an ``allclose``). A stub that raises
    ``NotImplementedYet`` (or ``NotImplementedError``) gets "not implemented yet" with ``hint``.
    """

    name: str
    reference: Callable[..., Any] = field(repr=False)
    cases: list[dict] = field(repr=False)
    same: Callable[[Any, Any], bool] = field(default=lambda a, b: a == b, repr=False)
    hint: str = "fill in the function body and run the cell again."
    show: Callable[[Any], str] = field(default=repr, repr=False)

    def check(self, fn: Callable[..., Any]) -> Verdict:
        for i, case in enumerate(self.cases):
            expected = self.reference(**case)
            try:
                got = fn(**case)
            except NotImplementedError:
                return Verdict(False, f"{self.name}: {self.hint}", answered=False,
                               pending="not implemented yet")
            except Exception as e:  # a student's bug is a verdict, not a crash of the notebook
                return Verdict(False, f"case {i} ({_args(case, self.show)}) raised "
                                      f"{type(e).__name__}: {e}")
            try:
                ok = bool(self.same(got, expected))
            except Exception as e:
                ok, expected = False, f"{self.show(expected)} (comparing raised {type(e).__name__}: {e})"
            if not ok:
                return Verdict(False, f"case {i} ({_args(case, self.show)}): got {self.show(got)}, "
                                      f"expected {self.show(expected)}")
        return Verdict(True, f"{self.name} agrees with the reference on all {len(self.cases)} cases")


def _args(case: dict, show: Callable[[Any], str]) -> str:
    text = ", ".join(f"{k}={show(v)}" for k, v in case.items())
    return text if len(text) <= 200 else text[:197] + "..."

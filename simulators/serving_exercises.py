"""Notebook 09's exercises and checkers: serving under load.

Owns three seeded exercises (compute a server's capacity from its step time, predict what lies past the
knee, compute the decoders' worst inter-token gap under a chunked-prefill budget), the goodput
implement-it and its checker, and the two written "run, vary, explain" questions. Every hint is shown
only after a wrong attempt (``simulators.hinted_exercises``). The written questions' rubrics and the
implement-it's known-wrong and alternative solutions are instructor data in
``simulators.serving_instructor``, which the notebook never imports. Pure Python; never imports the runner.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from simulators.exercises import (
    Exercise,
    ImplementIt,
    NotImplementedYet,
    Verdict,
    choice_exercise,
    parse_float,
)
from simulators.hinted_exercises import HintedExercise, HintedTask
from simulators.serving_model import StepTime, capacity

__all__ = ["make_capacity_exercise", "make_knee_exercise", "make_chunk_exercise", "goodput_task",
           "goodput_grading_task", "reference_goodput", "written_question", "NotImplementedYet"]


def _close(x: float, target: float, rel: float = 0.02) -> bool:
    return abs(x - target) <= rel * abs(target)


def _step(rng: random.Random) -> StepTime:
    return StepTime(rng.choice([3.0, 4.0, 5.0, 6.0]) * 1e-3, rng.choice([0.2, 0.3, 0.5, 0.8]) * 1e-3,
                    rng.choice([0.1, 0.15, 0.2, 0.3]) * 1e-3)


def _ms(step: StepTime) -> str:
    return (f"alpha = {step.alpha * 1e3:g} ms per step, beta = {step.beta * 1e3:g} ms per decoding request, "
            f"gamma = {step.gamma * 1e3:g} ms per prefill token")


def make_capacity_exercise(seed: int) -> HintedExercise:
    """Compute: the requests per second a server sustains with max_num_seqs always running."""
    rng = random.Random(seed)
    step = _step(rng)
    s, p, o = rng.choice([4, 8, 16]), rng.choice([16, 32, 64]), rng.choice([24, 32, 48, 64])
    answer = capacity(step, p, o, s)
    no_prefill = s / (o * step.alpha + (o - 1) * step.beta * s)
    one_seat = answer / s
    question = (f"A step takes alpha + beta x (decoding requests) + gamma x (prefill tokens), with "
                f"{_ms(step)}. Every request has a {p}-token prompt and generates {o} tokens (the step "
                f"that finishes its prompt samples the first). With max_num_seqs = {s} requests always "
                "running, how many requests per second does the server complete? (a number, requests/s)")

    def diagnose(a) -> Verdict:
        x = parse_float(a)
        if x is None or x <= 0:
            return Verdict(False, "give a positive number of requests per second.", attempt=False)
        if _close(x, answer):
            return Verdict(True, f"{s} requests per {o} x alpha + {o - 1} x beta x {s} + gamma x {s} x {p} "
                                 f"seconds = {answer:.2f} requests/s.")
        if _close(x, no_prefill):
            return Verdict(False, "that leaves out the prefill: every request's prompt passes through a step "
                                  "once, and those tokens cost gamma each.")
        if _close(x, one_seat):
            return Verdict(False, "that is one seat's rate; all the seats finish requests in parallel.")
        if _close(x, answer * o):
            return Verdict(False, "that is output tokens per second; the question asks for requests.")
        return Verdict(False, "count the seconds the seats need to finish one request each.")

    hint = ("S requests running together finish together after O steps: one that prefills them all "
            "(alpha + gamma S P) and O - 1 decode steps (alpha + beta S each).")
    return HintedExercise(Exercise(seed, question, answer, diagnose, hint=hint))


KNEE_RIGHT = ("p50 TTFT grows a lot; p50 ITL stays about the same",
              "the running batch is capped at max_num_seqs, so the step time and the ITL stay; requests "
              "queue before their first token, so TTFT grows")
KNEE_WRONG = [
    ("p50 ITL grows a lot; p50 TTFT stays about the same",
     "the batch cannot grow past max_num_seqs, so the step, and the gap between two tokens of a running "
     "request, stays the same; the extra requests wait before they start"),
    ("both grow about in proportion to the rate",
     "the running batch is capped, so a running request's steps do not slow down with the rate"),
    ("neither changes: the server already runs at its full throughput",
     "throughput is flat, but the queue in front of the server is not: each request waits longer before "
     "its first token"),
]


def make_knee_exercise(seed: int, max_num_seqs: int = 4) -> HintedExercise:
    """Predict (multiple choice): past the knee, what a doubled rate does to TTFT and ITL."""
    question = (f"A server runs with max_num_seqs = {max_num_seqs}. The offered request rate doubles "
                f"from 1.5x to 3x the rate it can complete (past the knee), for the same number of "
                f"requests. What happens?")
    hint = "what limits the batch a step runs, and where does a request wait when every seat is taken?"
    return HintedExercise(choice_exercise(seed, random.Random(seed), question, KNEE_RIGHT, list(KNEE_WRONG),
                                          hint=hint))


def make_chunk_exercise(seed: int) -> HintedExercise:
    """Compute: the decoders' worst inter-token gap when a long prompt arrives under a token budget."""
    rng = random.Random(seed)
    step = _step(rng)
    d = rng.choice([2, 4, 6])
    budget = rng.choice([16, 32, 64])
    prompt = rng.choice([150, 200, 240])
    answer = step(d, min(prompt, budget - d)) * 1e3
    no_decodes = step(d, min(prompt, budget)) * 1e3
    whole = step(d, prompt) * 1e3
    question = (f"{_ms(step)}. {d} requests are decoding when a {prompt}-token prompt arrives. The "
                f"step's token budget is max_num_batched_tokens = {budget} (decodes first, then prefill "
                "chunks). What is the longest gap between two tokens of a decoding request while the "
                "prompt is prefilled? (in ms)")

    def diagnose(a) -> Verdict:
        x = parse_float(a)
        if x is None or x <= 0:
            return Verdict(False, "give a positive number of milliseconds.", attempt=False)
        if _close(x, answer, 0.01):
            return Verdict(True, f"each chunk is {min(prompt, budget - d)} tokens (the budget less the {d} "
                                 f"decode tokens): {answer:.2f} ms.")
        if _close(x, whole, 0.01):
            return Verdict(False, "that step prefills the whole prompt at once: the budget cuts it into "
                                  "chunks.")
        if _close(x, no_decodes, 0.01):
            return Verdict(False, "the decode tokens count against the budget too.")
        return Verdict(False, "find the largest step a decoding request takes part in.")

    hint = "a step's tokens are its decode tokens plus its prefill chunk, together at most the budget."
    return HintedExercise(Exercise(seed, question, answer, diagnose, hint=hint))


# ---------------------------------------------------------------------------------------------
# Implement it: goodput from per-request timings

def reference_goodput(requests: list[dict], duration: float, slo_ttft: float, slo_tpot: float) -> float:
    """Requests per second of the run's duration that completed and met both SLOs (at most ``slo_ttft``
    to the first token; TPOT = (e2e - ttft) / (output tokens - 1) at most ``slo_tpot``, a request of one
    token meets it): vLLM's ``vllm bench serve`` goodput."""
    good = 0
    for r in requests:
        if r["error"] is not None:
            continue
        n = r["output_tokens"]
        tpot = (r["e2e"] - r["ttft"]) / (n - 1) if n > 1 else 0.0
        good += r["ttft"] <= slo_ttft and tpot <= slo_tpot
    return good / duration


def _synthetic_runs(seed: int, num: int = 6) -> list[dict]:
    """Seeded runs that reach every rule: failures, one-token outputs, a TTFT and a TPOT exactly at the
    SLO, requests that miss only one of the two."""
    rng = random.Random(seed)
    runs = []
    for k in range(num):
        # binary fractions: a time exactly at its bound stays exact whichever way a solution computes it
        slo_ttft, slo_tpot = rng.choice([0.0625, 0.25, 0.5]), rng.choice([2 ** -7, 2 ** -6, 2 ** -5])
        reqs, t_end = [], 0.0
        for i in range(rng.randint(8, 20)):
            n = rng.choice([1, 2, 8, 16, 32])
            ttft = slo_ttft * rng.choice([0.25, 0.75, 1.0, 1.25, 3.0])
            tpot = slo_tpot * rng.choice([0.5, 1.0, 1.125, 2.0])
            if k % 2 and i == 1:
                ttft, n = 2 * slo_ttft, 1  # a slow one-token request: misses on TTFT alone
            itl = [tpot] * (n - 1)
            e2e = ttft + tpot * (n - 1) if n > 1 else ttft + 2 ** -10  # the stream ends after its token
            start = rng.uniform(0, 2.0)
            t_end = max(t_end, start + e2e)
            error = "HTTP 400: bad request" if rng.random() < 0.1 else None
            reqs.append(dict(prompt_tokens=rng.randint(4, 64), output_tokens=0 if error else n,
                             ttft=None if error else ttft, itl=[] if error else itl,
                             e2e=None if error else e2e, error=error))
        runs.append(dict(requests=reqs, duration=t_end + rng.uniform(0.0, 0.5), slo_ttft=slo_ttft,
                         slo_tpot=slo_tpot))
    return runs


@dataclass
class GoodputTask:
    """Check ``fn(requests, duration, slo_ttft, slo_tpot) -> requests per second`` on seeded runs against
    ``reference_goodput``, and on measured runs against the load generator's own goodput figure
    (``measured``: dicts with ``requests``, ``duration``, ``slo_ttft``, ``slo_tpot`` and ``goodput``)."""

    measured: list[dict] = field(default_factory=list, repr=False)
    seed: int = 0
    synthetic: bool = True  # False: only the measured runs, against the load generator's own figures
    name: str = "goodput"
    hint: str = ("count a request when it completed (no error) and met both bounds, each 'at most'; its TPOT "
                 "is (e2e - ttft) / (output tokens - 1), and a one-token request has none to miss; divide by "
                 "the run's duration.")

    @property
    def cases(self) -> list[dict]:
        return (_synthetic_runs(self.seed) if self.synthetic else []) + self.measured

    def check(self, fn: Callable) -> Verdict:
        for i, case in enumerate(self.cases):
            args = {k: case[k] for k in ("requests", "duration", "slo_ttft", "slo_tpot")}
            where = "the load generator's figure" if "goodput" in case else "the reference"
            want = case.get("goodput", None)
            if want is None:
                want = reference_goodput(**args)
            label = f"{'measured' if 'goodput' in case else 'seeded'} run {i}"
            try:
                got = fn(**{k: (list(v) if k == "requests" else v) for k, v in args.items()})
            except NotImplementedError:
                return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
            except Exception as e:  # a student's bug is a verdict, not a crash
                return Verdict(False, f"{label} raised {type(e).__name__}: {e}")
            x = parse_float(got)
            if x is None or not math.isclose(x, want, rel_tol=1e-9, abs_tol=1e-12):
                return Verdict(False, f"{label} ({len(args['requests'])} requests, duration "
                                      f"{args['duration']:.3f} s, SLO TTFT {args['slo_ttft'] * 1e3:g} ms, "
                                      f"TPOT {args['slo_tpot'] * 1e3:g} ms): got {got!r}, {where} is "
                                      f"{want:.6g}")
        n_measured = sum("goodput" in c for c in self.cases)
        return Verdict(True, f"agrees with the reference on {len(self.cases) - n_measured} seeded runs and "
                             f"with the load generator's own goodput on {n_measured} measured runs")


def goodput_task(measured: list[dict] | None = None, seed: int = 0, synthetic: bool = True) -> HintedTask:
    """The implement-it; ``synthetic=False`` checks only the measured runs, against the load generator's
    own goodput (no reference in the check)."""
    return HintedTask(GoodputTask(list(measured or []), seed, synthetic), name="goodput")


def goodput_grading_task(seed: int = 0) -> HintedTask:
    """The implement-it as the course's grader runs it: the seeded runs as cases for
    ``fn(requests, duration, slo_ttft, slo_tpot)``, judged against ``reference_goodput`` to 1e-9."""
    task = GoodputTask(seed=seed)
    return HintedTask(ImplementIt("goodput", reference_goodput, task.cases, hint=task.hint,
                                  same=lambda got, want: parse_float(got) is not None
                                  and math.isclose(parse_float(got), want, rel_tol=1e-9, abs_tol=1e-12)))


# ---------------------------------------------------------------------------------------------
# Written questions: run, vary, explain (graded by an instructor against a rubric)

QUESTIONS = {
    1: ("Run section 2's sweep again with MAX_SEQS = 2 and then 8 (the server's --max-num-seqs, and the "
        "offline step-time fit with it). Where does the knee move, by how much, and what happens to p50 ITL "
        "below and above the knee? Explain each change with the step-time model, and say where the model's "
        "prediction and your measurement differ and why."),
    2: ("In section 5a, vary the token budget (BUDGETS) down to 8 and up to 512, and the long prompt's "
        "length. Plot the decoders' worst inter-token gap and the long request's TTFT against the budget. "
        "Which budget would you pick for an ITL bound of twice the plain decode step, what does it cost "
        "the long request, and why does a smaller budget stop helping?"),
}


@dataclass
class WrittenAnswer:
    """What a written answer's check says: not answered yet, or recorded for the instructor."""

    answered: bool
    why: str

    def __str__(self) -> str:
        return ("recorded: " if self.answered else "not answered yet: ") + self.why

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))


@dataclass(frozen=True)
class WrittenQuestion:
    number: int

    @property
    def question(self) -> str:
        return QUESTIONS[self.number]

    def check(self, answer: str | None) -> WrittenAnswer:
        words = len(str(answer or "").split())
        if words == 0:
            return WrittenAnswer(False, "run, vary, then write your explanation in my_answer (a paragraph, "
                                        "with the numbers you measured).")
        return WrittenAnswer(True, f"{words} words; your instructor grades it against the question's rubric "
                                   "(measured numbers, the mechanism, where the model misses).")

    def __str__(self) -> str:
        return f"Run, vary, explain {self.number}\n{self.question}"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))


def written_question(number: int) -> WrittenQuestion:
    if number not in QUESTIONS:
        raise ValueError(f"there are written questions {sorted(QUESTIONS)}, not {number}")
    return WrittenQuestion(number)

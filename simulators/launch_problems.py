"""Seeded launch-overhead problems, the exercises built on them, and the ``python -m simulators.launch``
command line.

Owns the random (but seeded) decode step the command line prints and the notebooks 04 and 05 exercises
check answers against (the eager step time, what a graph saves, the bucket a batch replays, which remedy
fits a step, and the implement-it step-time task); every answer comes from the timeline model in
simulators/launch.py. The same seed always gives the same problem. Never prints a solution by itself.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass

from simulators.buckets import capture_sizes, padded_batch_size
from simulators.cli_types import bounded_int, finite_float
from simulators.exercises import Exercise, ImplementIt, Verdict, parse_choice, parse_float
from simulators.launch import StepResult, simulate


@dataclass(frozen=True)
class LaunchProblem:
    """A random decode step: operator durations, launch cost, other host work, a batch and a ladder."""

    args: dict
    kernel_us: tuple[float, ...]
    launch_us: float
    host_other_us: float
    batch_size: int
    ladder: tuple[int, ...]

    def run(self, mode: str) -> StepResult:
        return simulate(self.kernel_us, self.launch_us, mode, host_other_us=self.host_other_us,
                        batch_size=self.batch_size, ladder=self.ladder)


def random_problem(seed: int, num_kernels: int | None = None,
                   launch_us: float | None = None) -> LaunchProblem:
    """Seeded: 6-12 operators of 1-12 µs (whole numbers), a 2-12 µs launch, 0-40 µs of other host work,
    a batch of 1-32 on the default ladder for 32 sequences."""
    rng = random.Random(seed)
    n = rng.randint(6, 12) if num_kernels is None else num_kernels
    launch = float(rng.randint(2, 12)) if launch_us is None else float(launch_us)
    if n < 1:
        raise ValueError("num_kernels must be at least 1")
    kernels = tuple(float(rng.randint(1, 12)) for _ in range(n))
    other = float(rng.randrange(0, 41, 5))
    batch = rng.randint(1, 32)
    ladder = tuple(capture_sizes(32))
    args = {"seed": seed, "num kernels": n, "launch us": launch, "host other us": other,
            "batch size": batch, "ladder": ",".join(map(str, ladder))}
    return LaunchProblem(args, kernels, launch, other, batch, ladder)


def make_step_exercise(seed: int) -> Exercise:
    """Compute: the eager step time of a random step, in µs (answer a number)."""
    p = random_problem(seed)
    eager = p.run("eager")
    question = (f"{len(p.kernel_us)} operators with device times {list(p.kernel_us)} µs; each launch "
                f"costs the host {p.launch_us} µs; the host first spends {p.host_other_us} µs preparing "
                "inputs. In eager mode, how many µs until the device finishes the last operator?")
    launches = p.host_other_us + len(p.kernel_us) * p.launch_us
    total_k = sum(p.kernel_us)

    def diagnose(answer) -> Verdict:
        value = parse_float(answer)
        if value is None:
            return Verdict(False, "answer with a number of microseconds", attempt=False)
        if abs(value - eager.step_us) < 0.5:
            return Verdict(True, f"the step is {eager.bound}-bound: the device is idle "
                                 f"{100 * eager.device_idle_fraction:.0f}% of the step.")
        if abs(value - (launches + total_k)) < 0.5:
            return Verdict(False, "that adds every launch to every kernel: on a GPU the host keeps "
                                  "issuing while the device runs, so they overlap.")
        if abs(value - max(launches, total_k)) < 0.5:
            return Verdict(False, "close: the device cannot start an operator before it is issued, "
                                  "and the last one still has to run after its launch.")
        return Verdict(False, "walk the operators in order: start_i = max(issued_i, end_(i-1)).")

    return Exercise(seed, question, eager.step_us, diagnose,
                    hint="operator i starts at max(the host's time after launching it, the end of "
                         "operator i-1); the step ends when the last operator ends.")


def make_graph_exercise(seed: int) -> Exercise:
    """Predict: how many µs one graph launch (same cost as one eager launch) saves on this step."""
    p = random_problem(seed)
    saving = p.run("eager").step_us - p.run("graph").step_us
    question = (f"Same step as make_step_exercise({seed}): {len(p.kernel_us)} operators "
                f"{list(p.kernel_us)} µs, {p.launch_us} µs per launch, {p.host_other_us} µs of other "
                "host work. Captured as one graph (one launch of the same cost, no per-node cost), how "
                "many µs shorter is the step?")

    def diagnose(answer) -> Verdict:
        value = parse_float(answer)
        if value is None:
            return Verdict(False, "answer with a number of microseconds", attempt=False)
        if abs(value - saving) < 0.5:
            return Verdict(True, "a graph removes the gaps the device spent waiting for launches; "
                                 "a device-bound step saves little.")
        if abs(value - (len(p.kernel_us) - 1) * p.launch_us) < 0.5 and saving != value:
            return Verdict(False, "that is the host time saved; the step only shortens where the "
                                  "device was waiting for a launch.")
        return Verdict(False, "simulate both: graph step = other + one launch + the sum of kernels.")

    return Exercise(seed, question, saving, diagnose,
                    hint="compute the eager step first (make_step_exercise), then the graph step.")


def make_bucket_exercise(seed: int) -> Exercise:
    """Compute: the captured size a batch runs at and the padding rows, as (bucket, padded_rows)."""
    p = random_problem(seed)
    bucket = padded_batch_size(p.batch_size, p.ladder)
    question = (f"Captured sizes {list(p.ladder)}. A decode batch of {p.batch_size} sequences replays "
                "which graph, and how many padding rows run with it? Answer (bucket, padded_rows).")

    def diagnose(answer) -> Verdict:
        try:
            got_bucket, got_pad = (int(x) for x in answer)
        except (TypeError, ValueError):
            return Verdict(False, "answer with two ints: (bucket, padded_rows)", attempt=False)
        if (got_bucket, got_pad) == (bucket, bucket - p.batch_size):
            return Verdict(True, f"the smallest captured size >= {p.batch_size} is {bucket}.")
        if got_bucket not in p.ladder:
            return Verdict(False, "only captured sizes can be replayed: pick one from the ladder.")
        if got_bucket < p.batch_size:
            return Verdict(False, "that graph has fewer rows than the batch; round up, not down.")
        if got_bucket != bucket:
            return Verdict(False, "a larger graph works but wastes more rows: take the smallest that fits.")
        return Verdict(False, "the bucket is right; padded rows = bucket - batch.")

    return Exercise(seed, question, (bucket, bucket - p.batch_size), diagnose,
                    hint="find the first size in the ladder that is at least the batch size.")


def make_remedy_exercise(seed: int) -> Exercise:
    """Explain: which single change shortens this eager step most? Answer "a", "b" or "c"."""
    p = random_problem(seed)
    kw = {"host_other_us": p.host_other_us}
    options = {
        "a": simulate(p.kernel_us, p.launch_us / 2, **kw).step_us,
        "b": simulate([k / 2 for k in p.kernel_us], p.launch_us, **kw).step_us,
        "c": simulate(p.kernel_us, p.launch_us, "graph", **kw).step_us,
    }
    best = min(options, key=lambda k: (options[k], k))
    question = (f"Same step as make_step_exercise({seed}), eager. Which single change shortens it most? "
                "(a) a host twice as fast at every launch; (b) a device twice as fast at every operator; "
                "(c) the whole step captured as one graph. Answer a, b or c.")
    what = {"a": "halving the launch cost", "b": "halving every kernel", "c": "one graph launch"}

    def diagnose(answer) -> Verdict:
        choice = parse_choice(answer, options)
        if choice is None:
            return Verdict(False, 'answer "a", "b" or "c"', attempt=False)
        detail = ", ".join(f"{k}: {options[k]:g} µs" for k in sorted(options))
        if options[choice] == options[best]:
            return Verdict(True, f"{what[choice]} gives the shortest step ({detail}).")
        return Verdict(False, f"{what[choice]} leaves {options[choice]:g} µs; simulate all three: "
                              "a host-bound step gains from host-side changes, a device-bound one "
                              "from a faster device.")

    return Exercise(seed, question, best, diagnose,
                    hint="first decide whether the step is host- or device-bound (make_step_exercise).")


def make_step_time_task(seed: int = 0, num_cases: int = 12) -> ImplementIt:
    """Implement it: ``eager_step_us(kernel_us, launch_us, host_other_us)``, the eager step by the
    max(host, device) rule, checked against ``simulate(...).step_us`` on seeded steps (host-bound,
    device-bound and mixed ones; the first cases are small enough to do by hand)."""
    rng = random.Random(seed)
    cases = [{"kernel_us": [5.0, 5.0, 5.0], "launch_us": 10.0, "host_other_us": 0.0},   # host-bound
             {"kernel_us": [10.0, 10.0, 10.0], "launch_us": 4.0, "host_other_us": 0.0},  # device-bound
             {"kernel_us": [10.0, 1.0, 1.0], "launch_us": 4.0, "host_other_us": 6.0}]    # mixed
    while len(cases) < num_cases:
        n, launch = rng.randint(3, 12), float(rng.randint(1, 12))
        cases.append({"kernel_us": [float(rng.randint(1, 20)) for _ in range(n)], "launch_us": launch,
                      "host_other_us": float(rng.randrange(0, 41, 5))})

    def reference(kernel_us, launch_us, host_other_us):
        return simulate(kernel_us, launch_us, host_other_us=host_other_us).step_us

    return ImplementIt(
        "eager_step_us", reference, cases,
        same=lambda got, expected: isinstance(got, int | float) and abs(got - expected) < 1e-6,
        hint="the host issues operator i after host_other_us + (i + 1) * launch_us; the device starts it "
             "at max(that time, the end of operator i - 1); return when the last one ends.")


# ---------------------------------------------------------------------------------------------
# command line: python -m simulators.launch -s SEED [-c]


def render(problem: LaunchProblem, compute: bool) -> str:
    """The text the command line prints for one problem."""
    out = [f"ARG {k} {v}" for k, v in {**problem.args, "compute answers": compute}.items()]
    out.append("")
    out.append("A decode step issues these operators in order (device time of each, µs):")
    out.append("  " + " ".join(f"{k:g}" for k in problem.kernel_us))
    out.append(f"Each eager launch costs the host {problem.launch_us:g} µs; before the first launch the host")
    out.append(f"spends {problem.host_other_us:g} µs on other work (scheduling, preparing inputs).")
    out.append("")
    eager, graph = problem.run("eager"), problem.run("graph")
    ladder = problem.run("graph_ladder")
    questions = [
        ("1. How long is the eager step (µs)? Is it host-bound or device-bound?",
         f"{eager.step_us:g} µs, {eager.bound}-bound (host busy {eager.host_busy_us:g} µs, device busy "
         f"{eager.device_busy_us:g} µs, device idle {100 * eager.device_idle_fraction:.1f}%)"),
        ("2. Captured as one graph (one launch of the same cost), how long is the step? What does the "
         "graph save?",
         f"{graph.step_us:g} µs; saves {eager.step_us - graph.step_us:g} µs "
         f"(host launch time {len(problem.kernel_us) * problem.launch_us:g} -> {problem.launch_us:g} µs)"),
        (f"3. With captured sizes {list(problem.ladder)}, a batch of {problem.batch_size} replays which "
         "graph, with how many padding rows?",
         f"bucket {ladder.bucket}, {ladder.padded_rows} padding rows"),
    ]
    for q, a in questions:
        out.append(q)
        out.append(("   answer: " + a) if compute else "   ?")
    if not compute:
        out.append("")
        out.append("Work them out, then run again with -c to see the answers.")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulators.launch",
        description="How long is this decode step; is it host- or device-bound; what does a CUDA graph "
                    "save? Each seed draws a step: operators with their device times, a launch cost "
                    "and other host work.")
    parser.add_argument("-s", "--seed", type=int, default=0, help="the same seed gives the same problem")
    parser.add_argument("-n", "--numkernels", type=bounded_int(1, 1000), default=None,
                        help="operators in the step (default: drawn from the seed, 6-12)")
    parser.add_argument("-l", "--launch", type=finite_float(0, 1000), default=None,
                        help="host µs per launch (default: drawn from the seed, 2-12)")
    parser.add_argument("-c", "--compute", action="store_true", help="show the answers")
    ns = parser.parse_args(argv)
    try:
        problem = random_problem(ns.seed, ns.numkernels, ns.launch)
        print(render(problem, ns.compute), end="")
    except ValueError as err:
        parser.error(str(err))
    return 0



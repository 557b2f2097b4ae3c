"""Launch overhead, small enough to do by hand: a discrete-event model of one decode step.

Owns the timeline of a step on two resources, the host (which prepares inputs and issues operators)
and the device (which runs them in issue order), in five modes: ``eager``, ``graph``, ``graph_ladder``,
``async`` and ``graph_async``; the seed article's dispatch arithmetic; the one GPU speed-up prediction
the course quotes (``predict_gpu_speedup``); seeded exercises and the ``python -m simulators.launch``
command line. Pure Python: it never imports torch or anything of the
runner; calibration figures measured on the runner come in as plain numbers.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass

from simulators.buckets import capture_sizes, check_ladder, padded_batch_size
from simulators.exercises import Exercise, ImplementIt, Verdict, parse_choice

MODES = ("eager", "graph", "graph_ladder", "async", "graph_async")
__all__ = ["MODES", "Event", "StepResult", "simulate", "dispatch_us_per_token", "plot_timeline",
           "capture_sizes", "padded_batch_size", "GpuPrediction", "predict_gpu_speedup",
           "ILLUSTRATIVE_GPU", "make_step_exercise", "make_graph_exercise",
           "make_bucket_exercise", "make_remedy_exercise", "make_step_time_task", "main"]


@dataclass(frozen=True, slots=True)
class Event:
    """One bar of the Gantt chart: ``resource`` ("host" or "device") is busy with ``kind`` from
    ``start_us`` to ``end_us``. ``kind`` is prepare, launch, graph_launch, kernel or postprocess;
    ``index`` is the operator's position in the step (-1 for whole-step host work)."""

    resource: str
    kind: str
    start_us: float
    end_us: float
    step: int = 0
    index: int = -1

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class StepResult:
    """What one simulated decode step costs. Times are per step (``async`` reports the steady state
    between consecutive steps); ``events`` holds every step simulated."""

    mode: str
    step_us: float
    host_busy_us: float
    device_busy_us: float
    events: tuple[Event, ...]
    batch_size: int = 1
    bucket: int | None = None  # graph_ladder: the captured size the batch ran at (None: ran eager)
    num_steps: int = 1

    @property
    def device_idle_fraction(self) -> float:
        """Share of the step the device waits for the host: 0 = always busy."""
        return max(0.0, 1.0 - self.device_busy_us / self.step_us) if self.step_us > 0 else 0.0

    @property
    def padded_rows(self) -> int:
        return 0 if self.bucket is None else self.bucket - self.batch_size

    @property
    def bound(self) -> str:
        """"host" when issuing the step takes longer than running it, else "device"."""
        return "host" if self.host_busy_us > self.device_busy_us else "device"


def dispatch_us_per_token(num_kernels: int, launch_us: float) -> float:
    """Host time spent only on launching one decode step's kernels (one token per sequence)."""
    if num_kernels < 0 or launch_us < 0:
        raise ValueError("num_kernels and launch_us must be non-negative")
    return num_kernels * launch_us


def _check(kernel_us: Sequence[float], launch_us: float, mode: str, others: dict) -> tuple[float, ...]:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    kernels = tuple(float(k) for k in kernel_us)
    if not kernels:
        raise ValueError("a step needs at least one operator: pass its device durations in kernel_us")
    if any(k < 0 for k in kernels):
        raise ValueError("operator durations (kernel_us) must be non-negative microseconds")
    for name, value in {"launch_us": launch_us, **others}.items():
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
    return kernels


def simulate(kernel_us: Sequence[float], launch_us: float, mode: str = "eager", *,
             host_other_us: float = 0.0, postprocess_us: float = 0.0,
             graph_launch_us: float | None = None, node_us: float = 0.0, synchronous: bool = False,
             batch_size: int = 1, ladder: Sequence[int] | None = None, padded_row_us: float = 0.0,
             num_steps: int = 6) -> StepResult:
    """Simulate one decode step (``async``: ``num_steps`` back to back) and return its timeline.

    kernel_us: device time of each operator, in issue order, at this batch size.
    launch_us: host time to issue one operator (eager); ``graph_launch_us`` (default ``launch_us``)
      issues a whole captured graph, whose device adds ``node_us`` per node.
    host_other_us: host work before the first launch (scheduling, input preparation);
      postprocess_us: host work after the step's results are back (appending tokens, stop checks).
    synchronous: the host waits for each operator to finish before issuing the next (a CPU, where the
      host thread is the device, or a sync after every launch).
    graph_ladder: the batch runs at ``padded_batch_size(batch_size, ladder)``; each padded row adds
      ``padded_row_us`` of device time to every operator. No rung large enough: the step runs eager.
    async: eager launches, but the host prepares step n+1 while the device still runs step n, and
      post-processes step n once it is done (async scheduling alone, without graphs).
    graph_async: both, as vLLM's Model Runner V2 runs decode: each step is one graph launch, and the
      host prepares step n+1 and post-processes step n while the device replays. Its steady state is
      max(host work per step, device work per step).
    """
    graph_launch = launch_us if graph_launch_us is None else graph_launch_us
    kernels = _check(kernel_us, launch_us, mode, {
        "host_other_us": host_other_us, "postprocess_us": postprocess_us,
        "graph_launch_us": graph_launch, "node_us": node_us, "padded_row_us": padded_row_us})
    if mode in ("async", "graph_async") and num_steps < 3:
        raise ValueError(f"{mode} needs num_steps >= 3 to reach a steady state")
    bucket = None
    if mode == "graph_ladder":
        sizes = capture_sizes(max(batch_size, 1)) if ladder is None else check_ladder(ladder)
        bucket = padded_batch_size(batch_size, sizes)
        if bucket is None:  # above the largest captured size: the runner runs the step eager
            return _eager(kernels, launch_us, host_other_us, postprocess_us, synchronous,
                          "graph_ladder", batch_size, None)
        pad = (bucket - batch_size) * padded_row_us
        return _graph(tuple(k + pad for k in kernels), graph_launch, node_us, host_other_us,
                      postprocess_us, "graph_ladder", batch_size, bucket)
    if mode == "graph":
        return _graph(kernels, graph_launch, node_us, host_other_us, postprocess_us, "graph",
                      batch_size, batch_size)
    if mode == "async":
        return _async(kernels, launch_us, host_other_us, postprocess_us, num_steps, batch_size)
    if mode == "graph_async":
        return _async(kernels, launch_us, host_other_us, postprocess_us, num_steps, batch_size,
                      graph=(graph_launch, node_us))
    return _eager(kernels, launch_us, host_other_us, postprocess_us, synchronous, "eager",
                  batch_size, None)


def _issue(kernels, launch_us, host_t, device_t, synchronous, step, events):
    """The host issues each operator in turn; the device starts it once issued and once the previous
    one is done. Returns (host time, device time) after the last operator."""
    for i, k in enumerate(kernels):
        events.append(Event("host", "launch", host_t, host_t + launch_us, step, i))
        host_t += launch_us
        start = max(host_t, device_t)
        events.append(Event("device", "kernel", start, start + k, step, i))
        device_t = start + k
        if synchronous:
            host_t = device_t
    return host_t, device_t


def _result(mode, events, step_us, batch_size, bucket, num_steps=1) -> StepResult:
    host = sum(e.duration_us for e in events if e.resource == "host") / num_steps
    device = sum(e.duration_us for e in events if e.resource == "device") / num_steps
    return StepResult(mode, step_us, host, device, tuple(events), batch_size, bucket, num_steps)


def _eager(kernels, launch_us, other, post, synchronous, mode, batch_size, bucket) -> StepResult:
    events = [Event("host", "prepare", 0.0, other)] if other else []
    host_t, device_t = _issue(kernels, launch_us, other, 0.0, synchronous, 0, events)
    done = max(host_t, device_t)  # the host waits for the sampled tokens
    if post:
        events.append(Event("host", "postprocess", done, done + post))
    return _result(mode, events, done + post, batch_size, bucket)


def _replay(kernels, graph_launch, node_us, host_t, device_t, step, events):
    """One graph launch at ``host_t``; the device replays every node back to back once the launch is
    issued and the previous work is done. Returns (host time, device time) afterwards."""
    events.append(Event("host", "graph_launch", host_t, host_t + graph_launch, step))
    host_t += graph_launch
    device_t = max(host_t, device_t)
    for i, k in enumerate(kernels):  # replay: nodes back to back, no host work between them
        events.append(Event("device", "kernel", device_t, device_t + k + node_us, step, i))
        device_t += k + node_us
    return host_t, device_t


def _graph(kernels, graph_launch, node_us, other, post, mode, batch_size, bucket) -> StepResult:
    events = [Event("host", "prepare", 0.0, other)] if other else []
    _, device_t = _replay(kernels, graph_launch, node_us, other, 0.0, 0, events)
    if post:
        events.append(Event("host", "postprocess", device_t, device_t + post))
    return _result(mode, events, device_t + post, batch_size, bucket)


def _async(kernels, launch_us, other, post, num_steps, batch_size, graph=None) -> StepResult:
    events: list[Event] = []
    host_t = device_t = 0.0
    done: list[float] = []
    pending: tuple[int, float] | None = None  # (step, device time it finishes) not yet post-processed
    for step in range(num_steps):
        if other:
            events.append(Event("host", "prepare", host_t, host_t + other, step))
            host_t += other
        if graph is None:
            host_t, device_t = _issue(kernels, launch_us, host_t, device_t, False, step, events)
        else:
            host_t, device_t = _replay(kernels, *graph, host_t, device_t, step, events)
        if pending is not None:  # step n-1's outputs, copied back while step n was being issued
            host_t = _post(events, pending, host_t, post, done)
        pending = (step, device_t)
    _post(events, pending, host_t, post, done)
    # The steady state: the time between the device finishing two consecutive steps. (The host's
    # post-processing times converge to the same period, but only after many steps when host and
    # device work per step are close; the device's finishing times settle from the first steps.)
    ends = [max(e.end_us for e in events if e.resource == "device" and e.step == s)
            for s in (num_steps - 2, num_steps - 1)]
    step_us = ends[1] - ends[0]
    return _result("async" if graph is None else "graph_async", events, step_us, batch_size,
                   None if graph is None else batch_size, num_steps)


def _post(events, pending, host_t, post, done) -> float:
    step, ready = pending
    start = max(host_t, ready)
    if post:
        events.append(Event("host", "postprocess", start, start + post, step))
    done.append(start + post)
    return start + post


# ---------------------------------------------------------------------------------------------
# the GPU prediction the course quotes (notebooks 04 and 05 call this one function with the same inputs)

# Illustrative GPU costs, not measurements: the seed article's 5 µs of host time per eager launch, one
# graph launch of the same cost, and a small decode kernel of 2 µs. Published per-launch costs are of
# that order (NVIDIA's "Getting Started with CUDA Graphs" on a V100, Hazy Research's "Look Ma, No
# Bubbles" on an H100: a few µs per launch); pass measured figures to predict a real GPU.
ILLUSTRATIVE_GPU = {"kernel_us": 2.0, "launch_us": 5.0}


@dataclass(frozen=True)
class GpuPrediction:
    """The four modes of one decode step of ``num_kernels`` equal kernels, and the graph's speed-up."""

    num_kernels: int
    eager: StepResult
    graph: StepResult
    async_: StepResult
    graph_async: StepResult

    @property
    def speedup(self) -> float:
        """Eager step time over graph step time: what capture alone buys."""
        return self.eager.step_us / self.graph.step_us

    def modes(self) -> tuple[StepResult, ...]:
        return (self.eager, self.graph, self.async_, self.graph_async)


def predict_gpu_speedup(num_kernels: int, kernel_us: float = ILLUSTRATIVE_GPU["kernel_us"],
                        launch_us: float = ILLUSTRATIVE_GPU["launch_us"], *,
                        graph_launch_us: float | None = None, host_other_us: float = 0.0,
                        postprocess_us: float = 0.0) -> GpuPrediction:
    """A decode step of ``num_kernels`` kernels of ``kernel_us`` each, issued at ``launch_us`` per eager
    launch, simulated eager, as one graph, with async scheduling, and with both. A prediction from the
    inputs given, never a measurement; the defaults are ``ILLUSTRATIVE_GPU``."""
    if not isinstance(num_kernels, int) or num_kernels < 1:
        raise ValueError(f"num_kernels must be a positive int, got {num_kernels!r}")
    kernels = [float(kernel_us)] * num_kernels
    kw = {"launch_us": launch_us, "graph_launch_us": graph_launch_us, "host_other_us": host_other_us,
          "postprocess_us": postprocess_us}
    return GpuPrediction(num_kernels, *(simulate(kernels, mode=m, **kw)
                                        for m in ("eager", "graph", "async", "graph_async")))


# ---------------------------------------------------------------------------------------------
# pictures

_COLORS = {"prepare": "#9e9e9e", "launch": "#e6862c", "graph_launch": "#c0392b",
           "kernel": "#2e86c1", "postprocess": "#6c3483"}


def plot_timeline(results: StepResult | Sequence[StepResult], ax=None, labels: Sequence[str] | None = None):
    """A Gantt chart: for each result, a host row and a device row, bars coloured by kind.

    Imports matplotlib only when called, so the simulator itself needs nothing beyond Python.
    Returns the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    results = [results] if isinstance(results, StepResult) else list(results)
    labels = list(labels) if labels is not None else [r.mode for r in results]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.9 + 0.8 * len(results)))
    ticks, names = [], []
    for row, (res, label) in enumerate(zip(results, labels, strict=True)):
        for lane, resource in enumerate(("device", "host")):
            y = row * 3 + lane
            bars = [e for e in res.events if e.resource == resource]
            ax.broken_barh([(e.start_us, e.duration_us) for e in bars], (y - 0.4, 0.8),
                           facecolors=[_COLORS[e.kind] for e in bars], edgecolor="white", linewidth=0.3)
            ticks.append(y)
            names.append(f"{label}: {resource}")
    ax.set_yticks(ticks, names)
    ax.set_xlabel("time (µs)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in _COLORS.items()], fontsize=7,
              loc="upper right", ncol=len(_COLORS))
    return ax


# ---------------------------------------------------------------------------------------------
# seeded problems: the command line prints them, notebooks check answers to them


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


def _number(answer) -> float | None:
    try:
        return float(answer)
    except (TypeError, ValueError):
        return None


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
        value = _number(answer)
        if value is None:
            return Verdict(False, "answer with a number of microseconds")
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
        value = _number(answer)
        if value is None:
            return Verdict(False, "answer with a number of microseconds")
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
            return Verdict(False, "answer with two ints: (bucket, padded_rows)")
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
    eager = p.run("eager")
    question = (f"Same step as make_step_exercise({seed}) ({eager.bound}-bound in eager mode). Which "
                "single change shortens it most? (a) a host twice as fast at launching; (b) a device "
                "twice as fast at every operator; (c) capture the step as one graph. Answer a, b or c.")
    what = {"a": "halving the launch cost", "b": "halving every kernel", "c": "one graph launch"}

    def diagnose(answer) -> Verdict:
        choice = parse_choice(answer, options)
        if choice is None:
            return Verdict(False, 'answer "a", "b" or "c"')
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
    parser.add_argument("-n", "--numkernels", type=int, default=None,
                        help="operators in the step (default: drawn from the seed, 6-12)")
    parser.add_argument("-l", "--launch", type=float, default=None,
                        help="host µs per launch (default: drawn from the seed, 2-12)")
    parser.add_argument("-c", "--compute", action="store_true", help="show the answers")
    ns = parser.parse_args(argv)
    try:
        problem = random_problem(ns.seed, ns.numkernels, ns.launch)
        print(render(problem, ns.compute), end="")
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

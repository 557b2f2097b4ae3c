"""Launch overhead, small enough to do by hand: a discrete-event model of one decode step.

Owns the timeline of a step on two resources, the host (which prepares inputs and issues operators)
and the device (which runs them in issue order), in five modes: ``eager``, ``graph``, ``graph_ladder``,
``async`` and ``graph_async``; the seed article's dispatch arithmetic; the one GPU speed-up prediction
the course quotes (``predict_gpu_speedup``) and the timeline plot. The seeded problems, exercises and
the ``python -m simulators.launch`` command line are in simulators/launch_problems.py. Pure Python: it
never imports torch or anything of the runner; calibration figures measured on the runner come in as
plain numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulators.buckets import capture_sizes, check_ladder, padded_batch_size

MODES = ("eager", "graph", "graph_ladder", "async", "graph_async")
__all__ = ["MODES", "Event", "StepResult", "simulate", "dispatch_us_per_token", "plot_timeline",
           "capture_sizes", "padded_batch_size", "GpuPrediction", "predict_gpu_speedup",
           "ILLUSTRATIVE_GPU", "KERNEL_MIN_US"]


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


def repeat_steps(result: StepResult, num_steps: int) -> StepResult:
    """A synchronous step (eager, graph) run ``num_steps`` times back to back: each starts when the one
    before has ended, so a picture can set it beside an async run of as many steps. The per-step
    figures are unchanged."""
    if result.mode in ("async", "graph_async"):
        raise ValueError("an async result already holds its num_steps steps")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    events = tuple(Event(e.resource, e.kind, e.start_us + s * result.step_us,
                         e.end_us + s * result.step_us, s, e.index)
                   for s in range(num_steps) for e in result.events)
    return StepResult(result.mode, result.step_us, result.host_busy_us, result.device_busy_us, events,
                      result.batch_size, result.bucket, num_steps)


# ---------------------------------------------------------------------------------------------
# the GPU prediction the course quotes (notebooks 04 and 05 call this one function with the same inputs)

# Illustrative GPU costs, not measurements: the seed article's 5 µs of host time per eager launch, one
# graph launch of the same cost, and a small decode kernel of 2 µs. Published per-launch costs are of
# that order (NVIDIA's "Getting Started with CUDA Graphs" on a V100, Hazy Research's "Look Ma, No
# Bubbles" on an H100: a few µs per launch); pass measured figures to predict a real GPU.
ILLUSTRATIVE_GPU = {"kernel_us": 2.0, "launch_us": 5.0}
# The shortest a GPU kernel runs, however little it does (starting it on the device, ramping up its first
# wave): an assumption of the model, in the 2-3 µs range, not a measurement; notebook 04 shows how the
# prediction moves with it.
KERNEL_MIN_US = 2.5


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
                        launch_us: float = ILLUSTRATIVE_GPU["launch_us"], *, num_views: int = 0,
                        view_us: float | None = None, kernel_min_us: float = 0.0,
                        graph_launch_us: float | None = None, host_other_us: float = 0.0,
                        postprocess_us: float = 0.0) -> GpuPrediction:
    """A decode step of ``num_kernels`` kernels of ``kernel_us`` each (at least ``kernel_min_us``: a
    kernel never runs shorter than the device's per-kernel minimum, KERNEL_MIN_US = 2-3 µs), issued at
    ``launch_us`` of host time per eager launch, plus ``num_views`` metadata-only operators that launch
    nothing but cost the host ``view_us`` each (default ``launch_us``: the same dispatch), spread evenly
    between the launches. Simulated eager, as one graph (the views are gone: a replay re-runs kernels
    only), with async scheduling, and with both. A prediction from the inputs given, never a
    measurement; the defaults are ``ILLUSTRATIVE_GPU``, no views, no minimum."""
    if not isinstance(num_kernels, int) or num_kernels < 1:
        raise ValueError(f"num_kernels must be a positive int, got {num_kernels!r}")
    if not isinstance(num_views, int) or num_views < 0:
        raise ValueError(f"num_views must be a non-negative int, got {num_views!r}")
    per_view = launch_us if view_us is None else view_us
    if per_view < 0 or kernel_min_us < 0:
        raise ValueError("view_us and kernel_min_us must be non-negative")
    kernels = [max(float(kernel_us), float(kernel_min_us))] * num_kernels
    eager_launch = launch_us + num_views * per_view / num_kernels  # each launch carries its share of views
    graph_launch = launch_us if graph_launch_us is None else graph_launch_us
    kw = {"host_other_us": host_other_us, "postprocess_us": postprocess_us}
    return GpuPrediction(num_kernels,
                         simulate(kernels, eager_launch, "eager", **kw),
                         simulate(kernels, eager_launch, "graph", graph_launch_us=graph_launch, **kw),
                         simulate(kernels, eager_launch, "async", **kw),
                         simulate(kernels, eager_launch, "graph_async", graph_launch_us=graph_launch, **kw))


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


if __name__ == "__main__":  # python -m simulators.launch: the command line lives with the problems
    from simulators.launch_problems import main

    raise SystemExit(main())

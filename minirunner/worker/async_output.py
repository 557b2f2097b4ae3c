"""One step ahead: a launched step's output, read later (vLLM's ``AsyncModelRunnerOutput``).

Owns the hand-off between launching a step and reading it. ``ModelRunner.execute`` returns a
``AsyncOutput`` as soon as the step is queued on the device: the sampled tokens stay on the device
(the next step's inputs are gathered from them there, ``PrevSampled``) while a non-blocking copy takes
them to pinned host memory; ``get_output`` waits for that copy only — for this step, not for any step
launched after it — and completes the RunnerOutput (the emitted runs, the sampled tokens' logprobs, the
step's device time from CUDA events, worker/async_output.StepTimer). The
synchronous engine calls ``get_output`` at once; with ``async_scheduling`` the engine launches step
N + 1 first (plain and speculative decode alike). On a CPU every step has finished when it returns, so
the order is the same and nothing overlaps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from minirunner.spec_decode.rejection_sampler import emitted_runs
from minirunner.worker.runner_output import RunnerOutput


@dataclass(eq=False)
class DeviceDrafts:
    """Drafts proposed on the device after a verify step sampled, before the host read it (MRv2's
    draft row): per request, in ``req_ids`` order, ``start`` the position of its last verified token
    (int64 [n]), ``last`` that token ([n]), ``tokens`` the k drafts after it ([n, k]) and ``q`` the
    draft model's distributions ([n * k, vocab]; None: greedy drafts, one-hot); ``rows`` the requests'
    worker state rows (the draft's device rows hold the same drafts there)."""

    req_ids: list[str]
    k: int
    start: torch.Tensor
    last: torch.Tensor
    tokens: torch.Tensor
    q: torch.Tensor | None
    rows: np.ndarray | None = None


@dataclass(eq=False)
class PrevSampled:
    """What the next step's inputs take from a launched step, on the device: ``tokens`` int64
    [num_sampling] (one each; None after a verify step) and each sampling request's row in it, or the
    drafts it proposed on the device (``drafts``)."""

    tokens: torch.Tensor | None
    row_of: dict[str, int]
    drafts: DeviceDrafts | None = None


class StepTimer:
    """A step's device time: CUDA events recorded around its launch and read with its output (behind
    the output's own wait, no extra sync); on a CPU the host clock, as the step has run when
    ``execute`` returns."""

    def __init__(self, device: torch.device):
        self._events = None
        self._t0, self._seconds = time.perf_counter(), 0.0
        if device.type == "cuda":
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()

    def stop(self) -> None:
        """The step is queued: record its end."""
        if self._events is not None:
            self._events[1].record()
        else:
            self._seconds = time.perf_counter() - self._t0

    def seconds(self) -> float:
        """The step's device time (waits for the step's end event on CUDA)."""
        if self._events is None:
            return self._seconds
        self._events[1].synchronize()
        return self._events[0].elapsed_time(self._events[1]) / 1e3


class AsyncOutput:
    """A launched step's RunnerOutput, completed by ``get_output`` once its tokens reach the host.

    ``sampled``: int64 on the device, [num_sampling] one token each, or [num_sampling, k + 1] emitted
    runs (-1 after each run ends); None when the runs are already on the host (``output.runs``) or
    nothing sampled. ``logprobs``: computes the sampled tokens' logprobs from the device tokens (run at
    read time, so a step launched ahead does not wait for it)."""

    def __init__(self, output: RunnerOutput, sampled: torch.Tensor | None = None,
                 logprobs: Callable[[torch.Tensor], object] | None = None, timer: StepTimer | None = None):
        self.output, self.sampled, self._logprobs, self._timer = output, sampled, logprobs, timer
        if timer is not None:
            timer.stop()
        self._host, self._ready = _copy_to_host(sampled)
        self.drafts: DeviceDrafts | None = None  # proposed on the device after this step sampled
        self._on_read: list[tuple[Callable, tuple]] = []

    def add_read(self, fn: Callable, *tensors: torch.Tensor) -> None:
        """Call ``fn(output, *host_tensors)`` when the step is read: ``tensors`` (device results queued
        after the step, e.g. its drafts) are copied to the host now, without waiting."""
        self._on_read.append((fn, tuple(_copy_to_host(t) for t in tensors)))

    def prev_sampled(self) -> PrevSampled | None:
        """What the next step may feed before this one is read: one-token-per-request samples, or the
        drafts proposed on the device after a verify step; None when neither."""
        row_of = {rid: i for i, rid in enumerate(self.output.req_ids)}
        if self.drafts is not None:
            return PrevSampled(None, row_of, self.drafts)
        if self.sampled is None or self.sampled.dim() != 1:
            return None
        return PrevSampled(self.sampled, row_of)

    def get_output(self) -> RunnerOutput:
        """The completed RunnerOutput (waits for this step's device-to-host copy only), with its device
        time (``device_s``)."""
        out = self.output
        if self._timer is not None:
            out.device_s, self._timer = self._timer.seconds(), None
        if self.sampled is not None:
            if self._ready is not None:
                self._ready.synchronize()
            out.runs = [[t] for t in self._host.tolist()] if self.sampled.dim() == 1 \
                else emitted_runs(self._host)
            if self._logprobs is not None:
                out.logprobs = self._logprobs(self.sampled)
            self.sampled = self._logprobs = None
        for fn, copies in self._on_read:
            for _, ready in copies:
                if ready is not None:
                    ready.synchronize()
            fn(out, *(host for host, _ in copies))
        self._on_read = []
        return out


def _copy_to_host(t: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.cuda.Event | None]:
    """(a host copy of ``t`` started without waiting, the event it is ready at); on a CPU ``t`` itself."""
    if t is None or t.device.type != "cuda":
        return t, None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready

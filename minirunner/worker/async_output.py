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

import torch

from minirunner.spec_decode.rejection_sampler import emitted_runs
from minirunner.worker.runner_output import RunnerOutput


@dataclass(eq=False)
class PrevSampled:
    """The tokens a launched step sampled, on the device, for the next step's inputs: ``tokens`` int64
    [num_sampling] and each sampling request's row in it."""

    tokens: torch.Tensor
    row_of: dict[str, int]


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
        self._host, self._ready = sampled, None
        if sampled is not None and sampled.device.type == "cuda":
            self._host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
            self._host.copy_(sampled, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def prev_sampled(self) -> PrevSampled | None:
        """The one-token-per-request samples, for the next step's placeholder inputs (None for runs)."""
        if self.sampled is None or self.sampled.dim() != 1:
            return None
        return PrevSampled(self.sampled, {rid: i for i, rid in enumerate(self.output.req_ids)})

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
        return out

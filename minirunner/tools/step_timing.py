"""Where an eager decode step's time goes, in seconds: per-operator dispatch cost, step times per batch
size, and the calibration of a step against its own operators replayed on a width-8 twin.

Owns timing only (the operator recording it times is tools/profiling.py). It drives engines through
their public step loop and leaves them with no requests; it never changes what a step computes.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from minirunner.tools.profiling import engine_of, finish_decode, record_step, replay_pass, start_decode


@torch.inference_mode()
def measure_op_overhead(reps: int = 2000, repeats: int = 7) -> dict[str, float]:
    """Seconds per call of a few everyday operators on one-element tensors, where the arithmetic is
    nothing and only the dispatch is left (median of ``repeats`` loops of ``reps`` calls each)."""
    x, w = torch.ones(1, 1), torch.ones(1, 1)
    ops = {
        "add": lambda: torch.add(x, x),
        "mul": lambda: torch.mul(x, x),
        "view": lambda: x.view(1),
        "linear": lambda: torch.nn.functional.linear(x, w),
        "to(float64)": lambda: x.to(torch.float64),
    }
    out = {}
    for name, fn in ops.items():
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            samples.append((time.perf_counter() - t0) / reps)
        out[name] = statistics.median(samples)
    return out


def measure_decode_steps(llms: Sequence, batch_sizes: Sequence[int] = (1, 8, 32), num_steps: int = 20,
                         prompt_len: int = 16, warmup: int = 2,
                         clock: Callable[[], float] = time.perf_counter,
                         statistic: Callable[[list[float]], float] = statistics.median,
                         ) -> list[dict[int, float]]:
    """Seconds of an eager decode-only engine step (the median of ``num_steps``, or ``statistic``), per
    batch size, for each engine in ``llms``.

    The engines step in turn (one step of each, then the next round), so on a noisy machine they see the
    same load and their ratio is fair. ``clock=time.thread_time`` counts CPU time of this thread only
    (a CPU engine; on a GPU keep wall time). Returns one {batch_size: seconds} per engine.
    """
    engines = [engine_of(x) for x in llms]
    result: list[dict[int, float]] = [{} for _ in engines]
    for b in batch_sizes:
        try:
            for e in engines:
                start_decode(e, b, prompt_len, max_tokens=warmup + num_steps + 2)
            samples: list[list[float]] = [[] for _ in engines]
            for i in range(warmup + num_steps):
                for e, s in zip(engines, samples, strict=True):
                    t0 = clock()
                    e.step()
                    elapsed = clock() - t0
                    if e.trace[-1].num_decode_tokens != b or e.trace[-1].num_prefill_tokens:
                        raise RuntimeError("a timed step was not a full decode step")
                    if i >= warmup:
                        s.append(elapsed)
            for r, s in zip(result, samples, strict=True):
                r[b] = statistic(s)
        finally:
            for e in engines:
                finish_decode(e)
    return result


def write_overhead_twin(model_dir: str | Path, out_dir: str | Path | None = None, width: int = 8,
                        seed: int = 0) -> Path:
    """A checkpoint with ``model_dir``'s architecture and layer count but every width cut to ``width``
    (random weights): the same operators in the same order, with almost no arithmetic in them.

    Timing its steps measures the per-operator host cost of *this* runner's code path, Python included.
    Writes config.json + model.safetensors under ``out_dir`` (a new temporary directory by default).
    """
    from minirunner.config import ModelConfig
    from minirunner.model.decoder import DecoderLM

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    # head counts stay: they decide the GQA path, so the twin dispatches exactly the same operators
    cfg.update(hidden_size=width, intermediate_size=width, head_dim=width)
    out = Path(tempfile.mkdtemp(prefix="minirunner-twin-") if out_dir is None else out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left where it was
        torch.manual_seed(seed)
        model = DecoderLM(ModelConfig.from_dict(cfg))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"))
    return out


@dataclass(frozen=True)
class EagerCalibration:
    """Figures that feed the launch simulator, measured side by side on this machine (seconds)."""

    batch_size: int
    num_ops: int                 # operators one decode step dispatches (the real model)
    host_per_op: float           # the twin's step time / its operator count
    kernel_times: tuple[float, ...]  # per operator: replay on the real inputs minus on the twin's
    measured_step: float         # the real model's median decode step
    twin_step: float             # the twin's median decode step

    @property
    def compute(self) -> float:
        return sum(self.kernel_times)


def calibrate_eager(llm, twin_llm, batch_size: int = 1, rounds: int = 10, steps_per_round: int = 2,
                    prompt_len: int = 16, clock: Callable[[], float] = time.thread_time,
                    statistic: Callable[[list[float]], float] = min) -> EagerCalibration:
    """Measure the inputs of the eager model of one decode step, and the step itself, side by side.

    ``twin_llm`` serves ``write_overhead_twin(...)`` of ``llm``'s model with the same engine settings.
    Each round replays both recorded steps once and times ``steps_per_round`` real steps of each
    engine, so every figure sees the same load. Each figure is the fastest of its samples (``statistic``
    may be ``statistics.median`` instead): on a shared machine noise only ever adds time. The default
    ``clock`` is ``time.thread_time``, the CPU time of this thread, so time spent descheduled in favour
    of other programs does not count (pass ``time.perf_counter`` for wall time; at the small batches
    calibrated here the step runs on this one thread).
    """
    engines = [engine_of(llm), engine_of(twin_llm)]
    try:
        for e in engines:
            start_decode(e, batch_size, prompt_len, rounds * steps_per_round + 4)
        real_ops, twin_ops = (record_step(e, batch_size, keep_args=True) for e in engines)
        if [r.name for r in real_ops.records] != [r.name for r in twin_ops.records]:
            raise RuntimeError("the twin dispatched different operators; build it with "
                               "write_overhead_twin from the same model directory")
        replays: list[list[list[float]]] = [[[] for _ in c.records] for c in (real_ops, twin_ops)]
        steps: list[list[float]] = [[], []]
        for c in (real_ops, twin_ops):
            replay_pass(c, None)
        for _ in range(rounds):
            for c, samples in zip((real_ops, twin_ops), replays, strict=True):
                replay_pass(c, samples, clock)
            for _ in range(steps_per_round):
                for e, s in zip(engines, steps, strict=True):
                    t0 = clock()
                    e.step()
                    s.append(clock() - t0)
                    if e.trace[-1].num_decode_tokens != batch_size:
                        raise RuntimeError("a timed step was not a full decode step")
    finally:
        for e in engines:
            finish_decode(e)
    real_t, twin_t = ([statistic(s) for s in r] for r in replays)
    kernels = tuple(max(0.0, a - b) for a, b in zip(real_t, twin_t, strict=True))
    real_step, twin_step = statistic(steps[0]), statistic(steps[1])
    return EagerCalibration(batch_size, real_ops.total, twin_step / twin_ops.total, kernels,
                            real_step, twin_step)

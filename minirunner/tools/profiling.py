"""What a decode step dispatches: aten operators counted per module, and replayed to time their arithmetic.

Owns measurement only: counting what one engine step dispatches (a ``TorchDispatchMode``), attributing
each operator to the innermost module running it (or to the attention backend, or to the runner
outside the model), telling operators that compute (each launches at least one kernel on a GPU) from
metadata-only ones (views, slices, no-op casts: no kernel), and replaying the recorded operators to time
their arithmetic (step times and per-operator host cost: tools/step_timing.py). It drives an engine
through its public step loop and leaves it with no requests; it never changes what a step computes.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minirunner.sampling_params import SamplingParams

BACKEND = "<attention backend>"
OUTSIDE = "<runner, outside the model>"


def engine_of(llm_or_engine):
    return getattr(llm_or_engine, "engine", llm_or_engine)


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One aten operator a step dispatched: its name, where it ran, and (when recorded) its inputs."""

    name: str
    where: str  # innermost module path ("model.layers.0.mlp.up_proj"), BACKEND or OUTSIDE
    func: object = field(default=None, repr=False)
    args: tuple = field(default=(), repr=False)
    kwargs: dict = field(default_factory=dict, repr=False)
    launches_kernel: bool = True  # False: metadata only (a view, a slice, a cast to the same dtype)


# Operators that allocate without writing: no kernel on a GPU (the caching allocator hands out memory).
_ALLOCATION_ONLY = frozenset({"aten.empty.memory_format", "aten.empty_strided.default",
                              "aten.empty_like.default", "aten.new_empty.default"})


def _storages(tree) -> list[int]:
    # an opaque tensor (a weight packed for oneDNN, model/cpu_linear.py) has no storage to share
    return [t.untyped_storage().data_ptr() for t in tree_leaves(tree)
            if isinstance(t, torch.Tensor) and not t.is_mkldnn]


def launches_kernel(func, args: tuple, kwargs: dict, out) -> bool:
    """Whether a dispatched aten operator does device work, from what it did: False when every tensor
    it returned shares storage with one of its inputs and it wrote none (a view, a slice, a reshape of
    a contiguous tensor, ``.to`` of the dtype it already has) or when it only allocated. In-place and
    ``out=`` operators write, so they count. On a GPU a True operator launches at least one kernel
    (composite ones, like ``matmul`` with a copy, may launch more; a profiler counts the kernels)."""
    if str(func) in _ALLOCATION_ONLY:
        return False
    schema = getattr(func, "_schema", None)
    if schema is not None and any(a.alias_info is not None and a.alias_info.is_write
                                  for a in schema.arguments):
        return True  # in-place or out=: it writes memory
    outs = _storages(out)
    if not outs:
        return True  # returns no tensor (e.g. a scalar read back to the host): a copy, not metadata
    inputs = set(_storages((args, kwargs)))
    return not all(o in inputs for o in outs)


@dataclass(frozen=True)
class OperatorCount:
    """The operators of one step. ``by_module`` counts each op once, under the innermost module that ran
    it; ``by_layer[i]`` sums layer i's modules and its attention-backend calls."""

    records: tuple[OpRecord, ...] = field(repr=False)

    @property
    def total(self) -> int:
        return len(self.records)

    @property
    def by_op(self) -> Counter:
        return Counter(r.name for r in self.records)

    @property
    def launching(self) -> int:
        """Operators that do device work: on a GPU each launches at least one kernel."""
        return sum(1 for r in self.records if r.launches_kernel)

    @property
    def metadata_only(self) -> int:
        """Views, slices and no-op casts: dispatched on the host, no kernel on a device."""
        return self.total - self.launching

    @property
    def by_module(self) -> Counter:
        return Counter(r.where for r in self.records)

    @property
    def attention_backend(self) -> int:
        return sum(1 for r in self.records if r.where.startswith(BACKEND))

    @property
    def outside_model(self) -> int:
        return sum(1 for r in self.records if r.where == OUTSIDE)

    @property
    def by_layer(self) -> dict[int, int]:
        counts: Counter = Counter()
        for r in self.records:
            layer = _layer_of(r.where)
            if layer is not None:
                counts[layer] += 1
        return dict(sorted(counts.items()))

    def under(self, prefix: str) -> int:
        """Operators run inside the module ``prefix`` or any of its submodules."""
        return sum(1 for r in self.records if r.where == prefix or r.where.startswith(prefix + "."))


def _layer_of(where: str) -> int | None:
    if where.startswith(BACKEND):  # "<attention backend>@model.layers.3.self_attn"
        where = where.split("@", 1)[1]
    parts = where.split(".")
    if len(parts) >= 3 and parts[:2] == ["model", "layers"]:
        return int(parts[2])
    return None


class _Recorder(TorchDispatchMode):
    def __init__(self, where: Callable[[], str], keep_args: bool):
        super().__init__()
        self.where, self.keep_args = where, keep_args
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kernel = launches_kernel(func, args, kwargs, out)
        if self.keep_args:
            # The very tensors, not copies: a replay then touches the same memory the step touched
            # (copies would each be cold in the cache). In-place operators replay onto the same
            # storage with the same inputs, which rewrites the same values.
            self.records.append(OpRecord(str(func), self.where(), func, args, kwargs, kernel))
        else:
            self.records.append(OpRecord(str(func), self.where(), launches_kernel=kernel))
        return out


@contextmanager
def _attributed(engine) -> Iterator[Callable[[], str]]:
    """Hooks that keep a stack of the modules running, and a wrapper marking the backend's calls."""
    stack: list[str] = []
    handles = []

    def enter(name):
        def hook(module, args) -> None:  # a hook returning a value would replace the inputs
            stack.append(name)
        return hook

    def leave(module, args, output) -> None:
        stack.pop()

    for name, module in engine.model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave))
    backend = engine.backend
    original = backend.forward

    def forward(*args, **kwargs):
        stack.append(BACKEND + "@" + (stack[-1] if stack else ""))
        try:
            return original(*args, **kwargs)
        finally:
            stack.pop()

    backend.forward = forward  # an instance attribute shadows the method while we count
    try:
        yield lambda: stack[-1] if stack else OUTSIDE
    finally:
        del backend.forward
        for h in handles:
            h.remove()


PREFIX = "profiling-"  # the requests profiling adds; it removes only these, never a user's


def start_decode(engine, batch_size: int, prompt_len: int, max_tokens: int) -> None:
    """Admit ``batch_size`` requests and step until the next step is decode only (one token each)."""
    if engine.has_unfinished_requests():
        raise ValueError("the engine still has requests: profile an idle engine (finish or abort them)")
    if batch_size < 1 or batch_size > engine.config.max_num_seqs:
        raise ValueError(f"batch_size must be within 1..max_num_seqs={engine.config.max_num_seqs}, "
                         f"got {batch_size}")
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(batch_size):
        prompt = [(7 * i + j) % (vocab - 1) + 1 for j in range(prompt_len)]
        engine.add_request(prompt, params, request_id=f"{PREFIX}{i}")
    for _ in range(4 * batch_size * prompt_len + 4):
        engine.step()
        last = engine.trace[-1]
        if last.num_prefill_tokens == 0 and last.num_decode_tokens == batch_size:
            return
    raise RuntimeError("the requests did not all reach decode; is the KV pool too small for the batch?")


def finish_decode(engine) -> None:
    engine.abort_all([rid for rid in list(engine.requests) if rid.startswith(PREFIX)])


def record_step(engine, batch_size: int, keep_args: bool) -> OperatorCount:
    with _attributed(engine) as where, _Recorder(where, keep_args) as rec:
        engine.step()
    if engine.trace[-1].num_decode_tokens != batch_size or engine.trace[-1].num_prefill_tokens:
        raise RuntimeError("the recorded step was not a full decode step")
    return OperatorCount(tuple(rec.records))


def record_decode_step(llm_or_engine, batch_size: int = 1, prompt_len: int = 16,
                       keep_args: bool = False) -> OperatorCount:
    """The aten operators one eager decode step of ``batch_size`` sequences dispatches, end to end
    (input preparation, the model, logits, sampling). ``keep_args`` also keeps their inputs for
    ``replay_times``. The engine is left with no requests."""
    engine = engine_of(llm_or_engine)
    start_decode(engine, batch_size, prompt_len, max_tokens=8)
    try:
        return record_step(engine, batch_size, keep_args)
    finally:
        finish_decode(engine)


@torch.inference_mode()
def replay_times(count: OperatorCount, passes: int = 15) -> list[float]:
    """Seconds each recorded operator takes when the whole recorded sequence is called again in order
    on its own inputs, straight from aten (no modules, no Python around it): the median over
    ``passes`` passes. In order, so each operator meets the caches as it did in the step. On a CPU
    this is the operator's C++ dispatch plus its arithmetic."""
    samples: list[list[float]] = [[] for _ in count.records]
    replay_pass(count, None)  # warm-up: first calls may initialise caches
    for _ in range(passes):
        replay_pass(count, samples)
    return [statistics.median(s) for s in samples]


def replay_pass(count: OperatorCount, samples: list[list[float]] | None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
    if any(r.func is None for r in count.records):
        raise ValueError("these operators were recorded without inputs: use keep_args=True")
    with torch.inference_mode():
        for i, r in enumerate(count.records):
            t0 = clock()
            r.func(*r.args, **r.kwargs)
            if samples is not None:
                samples[i].append(clock() - t0)


def record_verify_step(llm_or_engine, prompt_len: int = 16) -> OperatorCount:
    """The aten operators of one speculative engine step of one request with no prefill: the target's
    verify pass over the drafts, the rejection sampler, the rollback and the draft passes that propose
    the next step's drafts. Compare with ``record_decode_step`` of a plain engine (notebook 06)."""
    engine = engine_of(llm_or_engine)
    if engine.has_unfinished_requests():
        raise ValueError("the engine still has requests: profile an idle engine (finish or abort them)")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    engine.add_request([(j % (vocab - 1)) + 1 for j in range(prompt_len)], params, request_id=f"{PREFIX}v")
    try:
        for _ in range(prompt_len + 4):
            engine.step()
            last = engine.trace[-1]
            if last.num_prefill_tokens == 0 and last.num_draft_tokens:
                break
        count = record_step_any(engine)
        if not engine.trace[-1].num_draft_tokens or engine.trace[-1].num_prefill_tokens:
            raise RuntimeError("the recorded step did not verify drafts of a decoding request")
        return count
    finally:
        finish_decode(engine)


def record_step_any(engine) -> OperatorCount:
    """The operators of the engine's next step, whatever it runs."""
    with _attributed(engine) as where, _Recorder(where, False) as rec:
        engine.step()
    return OperatorCount(tuple(rec.records))

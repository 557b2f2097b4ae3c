"""The compiled forward of the steps no bucket replays (graph_mode="compile"): prefills, mixed steps,
ragged verify steps.

One ``torch.compile`` of the model's forward with the token count dynamic, so prompts of every length
share one graph, and each layer's attention left out of it as one opaque op (``minirunner::step_attention``,
vLLM's piecewise compile): what attention needs from a step (sequence groups, masks, block rows) varies in
ways a graph cannot hold, while the projections, norms, RoPE and MLP between two attentions fuse. The op
runs the backend's own eager forward on the metadata of the step in flight, scoped visibly around the one
forward (``forward_context``, vLLM's ``set_forward_context``): set on entry, cleared on exit, one
forward at a time in a process. Steps of one token run the model eagerly: a graph
specialised to one row would be a second compile for a step that a bucket usually takes.

It owns no state of the step and writes nothing but the KV cache, through the backend.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from minirunner.custom_ops import define
from minirunner.worker.compile_cache import COMPILE_OPTIONS

_context: tuple | None = None  # (backend, meta) of the compiled forward in flight: ``forward_context`` only


@contextmanager
def forward_context(backend, meta) -> Iterator[None]:
    """Scope a step's backend and attention metadata around one compiled forward, for its opaque
    attention op; nothing outlives the forward. Raises if a compiled forward is already in flight."""
    global _context
    if _context is not None:
        raise RuntimeError("a compiled forward is already running in this process: run one engine's "
                           "steps at a time (graph_mode='compile')")
    _context = (backend, meta)
    try:
        yield
    finally:
        _context = None


def _step_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor
                    ) -> torch.Tensor:
    """The backend's forward for this layer on the metadata of the step in flight: writes k and v into
    ``kv_cache`` and returns the attention output [num_tokens, num_q_heads, head_dim], contiguous (the
    layout the graph was traced with)."""
    backend, meta = _context
    return backend.forward(q, k, v, kv_cache, meta).contiguous()


step_attention = define("step_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache) -> Tensor",
                        _step_attention, lambda q, k, v, kv_cache: q.new_empty(q.shape))


class _OpaqueAttention:
    """What the traced model sees as its backend: each layer's attention is the opaque op."""

    def forward(self, q, k, v, kv_cache, meta):
        return step_attention(q, k, v, kv_cache)


@dataclass
class _Positions:
    """The one field of the metadata the model reads itself (RoPE); the rest stays with the backend."""

    positions: torch.Tensor


_OPAQUE = _OpaqueAttention()


def _forward(model, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor]):
    return model(input_ids, _Positions(positions), kv_caches, _OPAQUE)


class CompiledForward:
    """Called like the model (``(input_ids, meta, kv_caches, backend) -> hidden``), after the backend's
    ``plan(meta)``. Compiles on first use; the graph is cached on disk like the buckets' steps."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._compiled = torch.compile(own_code(_forward, "compiled_forward"), fullgraph=True,
                                       options=COMPILE_OPTIONS)

    @staticmethod
    def takes(num_tokens: int) -> bool:
        """Whether a step of ``num_tokens`` runs through the graph (two tokens or more)."""
        return num_tokens >= 2

    def __call__(self, input_ids: torch.Tensor, meta, kv_caches: list[torch.Tensor], backend) -> torch.Tensor:
        if not self.takes(input_ids.shape[0]):
            return self.model(input_ids, meta, kv_caches, backend)
        positions = meta.positions
        # one graph for every token count, from the first compile on (no static first graph)
        torch._dynamo.mark_dynamic(input_ids, 0)  # noqa: SLF001 (torch's public marker lives there)
        torch._dynamo.mark_dynamic(positions, 0)  # noqa: SLF001
        with forward_context(backend, meta):
            return self._compiled(self.model, input_ids, positions, kv_caches)


def own_code(fn: Callable, name: str) -> Callable:
    """A copy of ``fn`` with its own code object. Dynamo keeps its compiled entries per code object, and
    every bucket's step is a closure of one ``def`` (every engine's forward, this module's ``_forward``):
    shared, they would pile up as recompiles of one frame and pass the recompile limit (8), after which
    dynamo silently runs eager."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def unguarded(fn: Callable, compiled: Callable) -> Callable:
    """What replays ``fn``'s compiled step after its first call (through ``compiled``, its torch.compile
    wrapper, which traced and checked it): the code dynamo made of ``fn``, run as a plain function, so
    each replay skips the wrapper and its guards, as a CUDA graph replays without checking its inputs.
    Sound for a bucket's step only: a closure with no arguments over the runner's fixed buffers and
    weights, one compiled entry that nothing replaces (shapes, dtypes and devices never change after
    start-up). ``compiled`` itself where dynamo holds anything but one entry for ``fn``'s code, or this
    torch keeps its entries out of reach."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: PLC0415 (private API)

        entries = _debug_get_cache_entry_list(fn.__code__)
    except (ImportError, AttributeError, TypeError):
        return compiled
    if len(entries) != 1:
        return compiled
    return types.FunctionType(entries[0].code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)

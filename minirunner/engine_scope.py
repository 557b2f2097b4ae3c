"""What an engine sets for its own work and puts back after: the caller's process is left as it was.

Owns two settings, applied around the engine's construction and each of its steps (``applied``), and
restored when they end:

- torch's CPU threads (``num_threads``: an int, "auto" for one per core this process may run on, divided
  among the tensor-parallel ranks; None leaves torch's setting). Torch keeps the count per OS thread,
  so two engines in one notebook each step with their own count, and the caller's count is unchanged.
- torch's compile-cache folder under graph_mode="compile" (worker/compile_cache.py).

Building an engine seeds no global generator (sampling noise is a hash of each request's seed; the
engine's own seed source is a private ``random.Random``) and freezes no garbage-collector heap: only
the entry points (the CLI, the server) freeze it, through core/gc_heap.py.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from minirunner.config import EngineConfig


def engine_threads(config: EngineConfig) -> int | None:
    """The torch thread count an engine's CPU work runs with: ``num_threads`` if an int; under "auto" one
    per core this process may run on (divided among the tensor-parallel ranks, each of which uses the
    number returned); None on a GPU or under ``num_threads=None`` (torch's setting, untouched).
    On an oversubscribed machine (more runnable threads than cores) one thread is far faster: pass
    num_threads=1 there (measurements: benchmarks/README.md)."""
    if config.device.type != "cpu" or config.num_threads is None:
        return None
    if config.num_threads == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, cores // config.tensor_parallel_size)
    return config.num_threads


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``num_threads`` for the body (None: unchanged), then put back."""
    before = torch.get_num_threads()
    if num_threads is None or num_threads == before:
        yield
        return
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class EngineScope:
    """One engine's settings: ``num_threads`` (None: torch's, untouched) and ``compile_cache`` (None:
    no compiled steps)."""

    num_threads: int | None = None
    compile_cache: Path | None = None

    @classmethod
    def for_config(cls, config: EngineConfig) -> EngineScope:
        """The scope of an engine built from ``config`` (resolved). Under graph_mode="compile" the cache
        folder is created and checked here (ValueError naming ``MINIRUNNER_COMPILE_CACHE``)."""
        folder = None
        if config.graph_mode == "compile":
            from minirunner.worker.compile_cache import configure_compile_cache

            folder = configure_compile_cache()
        return cls(engine_threads(config), folder)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The engine's settings for the body; the caller's back after it, also when it raises."""
        with ExitStack() as stack:
            stack.enter_context(torch_threads(self.num_threads))
            if self.compile_cache is not None:
                from minirunner.worker.compile_cache import inductor_cache_dir

                stack.enter_context(inductor_cache_dir(self.compile_cache))
            yield


def in_engine_scope(method: Callable) -> Callable:
    """Decorate an engine method that does the engine's work: it runs inside ``self.scope.applied()``."""

    @functools.wraps(method)
    def scoped(self, *args, **kwargs):
        with self.scope.applied():
            return method(self, *args, **kwargs)
    return scoped

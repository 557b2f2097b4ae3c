"""The environment variables minirunner reads, and the one place it reads them (vLLM's ``vllm.envs``).

Each is read when it is used (``envs.CC``), not at import, so a variable set after ``import minirunner``
counts. Every other module in minirunner/ reads a variable through this one (tests/test_process_state.py
checks it). The one write is ``temporarily``: a variable of another library (torch's compile-cache folder)
set for a block of the engine's work and put back after.

- ``MINIRUNNER_COMPILE_CACHE``: the folder compiled steps and the C decode kernel are cached in
  (worker/compile_cache.py); unset or empty: the default.
- ``CC``: the C compiler that builds the CPU decode kernel, split like a shell word list
  (``CC="ccache gcc"`` works; kernels/paged_decode_cpu.py); unset or empty: cc, gcc or clang.
- ``TRITON_INTERPRET``: "1" runs Triton kernels in its interpreter (on a CPU: tests only).
- ``VLLM_TORCH_PROFILER_DIR``: where ``LLM.start_profile()`` writes its trace when given no folder
  (vLLM's name).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _text(name: str) -> Callable[[], str | None]:
    """The variable's value; None where it is unset or empty."""
    return lambda: os.environ.get(name) or None


_READERS: dict[str, Callable[[], object]] = {
    "MINIRUNNER_COMPILE_CACHE": _text("MINIRUNNER_COMPILE_CACHE"),
    "CC": _text("CC"),
    "TRITON_INTERPRET": lambda: os.environ.get("TRITON_INTERPRET") == "1",
    "VLLM_TORCH_PROFILER_DIR": _text("VLLM_TORCH_PROFILER_DIR"),
}

MINIRUNNER_COMPILE_CACHE: str | None
CC: str | None
TRITON_INTERPRET: bool
VLLM_TORCH_PROFILER_DIR: str | None


def __getattr__(name: str):
    try:
        return _READERS[name]()
    except KeyError:
        raise AttributeError(f"minirunner.envs has no variable {name!r}; it reads {sorted(_READERS)}") \
            from None


def __dir__() -> list[str]:
    return sorted(_READERS)


@contextmanager
def temporarily(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` for the body, then put back as it was (unset included)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before

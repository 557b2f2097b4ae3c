"""Triton where it is installed, and a stand-in where it is not (e.g. macOS), so the torch twins in this
package always import. Calling a Triton kernel without Triton raises an error saying what to use."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAS_TRITON = False

    _MESSAGE = ("Triton is not installed here: use the torch twins (the *_ref functions, "
                "attention_backend='torch'), or install triton on Linux")

    class _MissingKernel:
        def __init__(self, fn):
            self.__name__ = getattr(fn, "__name__", "kernel")
            self.__doc__ = getattr(fn, "__doc__", None)

        def __getitem__(self, grid):
            raise ImportError(_MESSAGE)

        def __call__(self, *args, **kwargs):
            raise ImportError(_MESSAGE)

    class _MissingTriton:
        """Stands in for both ``triton`` and ``triton.language``."""

        def jit(self, fn=None, **_kwargs):
            return _MissingKernel(fn) if fn is not None else _MissingKernel

        def __getattr__(self, name):
            raise ImportError(_MESSAGE)

    triton = tl = _MissingTriton()



_LOGGED: set[str] = set()


def use_triton(device) -> bool:
    """The one choice between a Triton kernel and its torch twin: Triton on CUDA where it is installed,
    the twin everywhere else (on a CPU the kernels run only under the interpreter, which the tests
    choose themselves). Logged once per device type."""
    chosen = device.type == "cuda" and HAS_TRITON
    if device.type not in _LOGGED:
        _LOGGED.add(device.type)
        logger.info("kernels on %s: %s", device.type, "Triton" if chosen else "torch twins")
    return chosen


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton's block sizes must be powers of two."""
    return 1 << max(0, (int(n) - 1).bit_length())


def upcast_for_interpreter(t) -> bool:
    """Whether a kernel must do its dots in fp32: the interpreter (CPU tensors) computes bf16 ``tl.dot``
    wrongly (triton#11584)."""
    return t.device.type == "cpu"


__all__ = ["HAS_TRITON", "next_pow2", "tl", "triton", "upcast_for_interpreter", "use_triton"]

"""Triton where it is installed, and a stand-in where it is not (e.g. macOS), so the torch twins in this
package always import. Calling a Triton kernel without Triton raises an error saying what to use."""

from __future__ import annotations

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

__all__ = ["HAS_TRITON", "tl", "triton"]

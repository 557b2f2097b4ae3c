"""How minirunner defines its own torch operators (namespace ``minirunner``), the ones a compiled graph
calls as opaque external kernels (model/cpu_linear.py's packed linear, worker/compiled_forward.py's
attention).

Each is one schema on a ``torch.library.Library`` fragment, one ``CompositeExplicitAutograd`` kernel (every
device and layout, oneDNN's packed tensors included) and a fake kernel for tracing. Not
``torch.library.custom_op``: its Python wrappers around every call cost several times what the dispatcher
itself does, paid once per projection per step (``benchmarks/README.md``, "Custom operators"). The
operators run in inference only: none has an autograd formula.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIB = torch.library.Library("minirunner", "FRAGMENT")


def define(schema: str, kernel: Callable, fake: Callable) -> torch._ops.OpOverload:  # noqa: SLF001 (the type)
    """Define ``minirunner::<schema>`` with ``kernel`` for real tensors and ``fake`` for traced ones
    (shapes and dtypes only); returns the operator's default overload, the callable a graph holds."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"minirunner::{name}", fake, lib=_LIB)
    return getattr(torch.ops.minirunner, name).default

"""A CPU linear layer on weights packed once for oneDNN (torch's ``mkldnn`` ops), for batches of rows.

Owns the choice (made once per process and dtype: oneDNN present, and a probe that agrees with
``F.linear``), the packing of a weight, and ``packed_linear``: eager calls oneDNN directly; under
``torch.compile`` the call goes through the operator ``minirunner::packed_linear``, which inductor keeps
as one external kernel (it cannot lower oneDNN's linear on a packed weight that is a graph input).

Why: a decode step reads every weight once, and MKL's sgemm repacks the [out, in] weight on every call
for a few rows. With the weight packed at load, the embedded model's projections at 2 to 8 rows take
about half the time, and 1.4x less at 32 to 64 rows (``benchmarks/README.md``, "Packed weights"). One
row keeps the contiguous [in, out] copy (FusedLinear), which is faster still there. The values differ
from ``F.linear`` by rounding only (another summation order).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from minirunner.custom_ops import define

logger = logging.getLogger(__name__)


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether CPU weights of ``dtype`` are packed for oneDNN: float32 only (what was measured), oneDNN
    built in, and its linear agreeing with ``F.linear`` on a probe."""
    if dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(24, 16, generator=gen)
        x = torch.randn(3, 16, generator=gen)
        ok = torch.allclose(_onednn(x, pack(w), None), F.linear(x, w), rtol=1e-4, atol=1e-5)
    except (RuntimeError, AttributeError) as err:  # an op missing from this build of torch
        logger.warning("CPU linear layers use F.linear: oneDNN's packed linear is unavailable (%s)", err)
        return False
    if ok:
        logger.info("CPU linear layers of %s: oneDNN packed weights for 2+ rows", dtype)
    else:
        logger.warning("CPU linear layers of %s use F.linear: oneDNN's packed linear disagreed", dtype)
    return ok


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] reordered into oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())  # noqa: SLF001 (torch op)


def _onednn(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # noqa: SLF001 (torch op)


def _fake_linear(x, packed, bias, out_features):
    return x.new_empty((x.shape[0], out_features))


_packed_linear_op = define(
    "packed_linear(Tensor x, Tensor packed, Tensor? bias, SymInt out_features) -> Tensor",
    lambda x, packed, bias, out_features: _onednn(x, packed, bias), _fake_linear)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                  out_features: int) -> torch.Tensor:
    """x [rows, in] @ the packed weight (+ bias) -> [rows, out_features]."""
    if torch.compiler.is_compiling():
        return _packed_linear_op(x, packed, bias, out_features)
    return _onednn(x, packed, bias)

"""Batch-invariant mode, the model's side (``batch_invariant=True``): each row's arithmetic independent
of the batch it runs in.

Owns the mode's linear layers, its RoPE table and ``apply``, which switches a loaded model over. What
the mode changes, and why (measured on a CPU: ``benchmarks/README.md``, "Batch-invariant mode"):

* Projections and lm_head go through oneDNN's packed linear at 2 to 256 rows a call. MKL's ``F.linear``
  gives a row the same result only within classes of row counts ({1}, {2..10}, {11 and more} at
  K = 256), so a request's numbers change with its batch. oneDNN's packed kernel gave every row the same
  bits from 2 rows up to 600 at every shape probed, while one row takes another kernel at large K. So a
  call with one row is padded to two where one row meets another kernel (the probe decides, per weight
  shape), and one of more than 256 rows is split into calls of 256. ``apply`` checks this on the
  model's own weights first and raises if it does not hold here.
* RoPE's cos and sin come from a table filled once in fixed blocks of positions: torch's vectorised
  ``cos`` may handle a tensor's last elements (and a thread's) with scalar code, whose rounding differs,
  so a position's value could depend on how many tokens the step has.
* RMSNorm, log-softmax, SiLU and the other element-wise operators give a row the same bits whatever the
  row count (probed, not changed). Attention is the backend's (attention/batch_invariant.py).

It never changes a weight's values, only which kernel meets them.
"""

from __future__ import annotations

import logging

import torch

from minirunner.log import warning_once
from minirunner.model import cpu_linear

logger = logging.getLogger(__name__)

MIN_ROWS = 2  # oneDNN's packed linear takes another kernel for one row at large K
MAX_ROWS = 256  # more rows are split into calls of at most this many (every call in the probed range)
ROPE_BLOCK = 256  # positions per block of the RoPE table (every block computed with one shape)
PROBE_ROWS = (2, 3, 5, 17, 64, 255, 256, 300)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int,
           min_rows: int = MIN_ROWS) -> torch.Tensor:
    """x [rows, in] @ the packed weight (+ bias) -> [rows, out_features], the same bits for a row
    whatever ``rows`` is: fewer rows than ``min_rows`` are padded to it, more than ``MAX_ROWS`` split into
    calls of ``MAX_ROWS``, so every call has a row count the probe checked."""
    rows = x.shape[0]
    if rows > MAX_ROWS:
        return torch.cat([linear(x[i:i + MAX_ROWS], packed, bias, out_features, min_rows)
                          for i in range(0, rows, MAX_ROWS)])
    if rows >= min_rows:
        return cpu_linear.packed_linear(x, packed, bias, out_features)
    padded = torch.cat((x, x.new_zeros(min_rows - rows, x.shape[1])))
    return cpu_linear.packed_linear(padded, packed, bias, out_features)[:rows]


def check_rows(packed: torch.Tensor, in_features: int, out_features: int, min_rows: int = MIN_ROWS) -> bool:
    """Whether ``linear`` gives each row the same bits at every probed row count (and one row) as in
    one call of 300 rows (random rows, a fixed seed)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max(PROBE_ROWS), in_features, generator=gen)

    def call(rows):
        return linear(rows, packed, None, out_features, min_rows)
    full = call(x)
    return all(torch.equal(call(x[:m]), full[:m]) for m in (1, *PROBE_ROWS)) \
        and torch.equal(call(x[7:9]), full[7:9]) and torch.equal(call(x[9:10]), full[9:10]) \
        and torch.equal(cpu_linear.packed_linear(x[:MAX_ROWS], packed, None, out_features), full[:MAX_ROWS])


def fewest_rows(packed: torch.Tensor | None, in_features: int, out_features: int) -> int:
    """The fewest rows a call needs for ``linear`` to give every row the same bits: 1 where one row
    meets the same kernel as many (the probe says so), else ``MIN_ROWS``; 0 where neither holds."""
    if packed is None:
        return 0
    return next((m for m in (1, MIN_ROWS) if check_rows(packed, in_features, out_features, m)), 0)


class InvariantLinear:
    """lm_head's forward under the mode: ``linear`` over a packed copy of its [vocab, hidden] weight."""

    def __init__(self, weight: torch.Tensor):
        self.packed, self.out_features = cpu_linear.pack(weight.detach()), weight.shape[0]
        self.min_rows = fewest_rows(self.packed, weight.shape[1], self.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.packed, None, self.out_features, self.min_rows)


class InvariantRotary(torch.nn.Module):
    """RoPE's (cos, signed_sin) looked up in a table: each block of ``ROPE_BLOCK`` positions is
    computed by the model's own ``RotaryEmbedding`` with the same shape, so a position's values never
    depend on the step (the table grows block by block, earlier blocks unchanged)."""

    def __init__(self, rotary: torch.nn.Module):
        super().__init__()
        self.rotary = rotary
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, upto: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables.get(dtype, (None, None))
        have = 0 if cos is None else cos.shape[0]
        if have < upto:
            dev = self.rotary.inv_freq.device
            blocks = [self.rotary(torch.arange(start, start + ROPE_BLOCK, device=dev), dtype)
                      for start in range(have, upto, ROPE_BLOCK)]
            new_cos = torch.cat([b[0] for b in blocks])
            new_sin = torch.cat([b[1] for b in blocks])
            cos = new_cos if cos is None else torch.cat((cos, new_cos))
            sin = new_sin if sin is None else torch.cat((sin, new_sin))
            self._tables[dtype] = (cos, sin)
        return cos, sin

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        top = int(positions.max()) + 1 if positions.numel() else 1
        cos, sin = self._table(-(-top // ROPE_BLOCK) * ROPE_BLOCK, dtype)
        return cos.index_select(0, positions), sin.index_select(0, positions)


def supported(dtype: torch.dtype, device: torch.device) -> str | None:
    """None where the mode can run, else why not (for the engine's error)."""
    if device.type != "cpu":
        return (f"batch_invariant=True runs on a CPU only for now (device {device.type!r}): its GPU "
                "kernels are not written yet; pass device='cpu' or leave batch_invariant off")
    if dtype != torch.float32:
        return (f"batch_invariant=True needs dtype=float32 (got {dtype}): its attention kernel is "
                "float32; pass dtype='float32'")
    if not cpu_linear.packs(torch.float32):
        return ("batch_invariant=True needs oneDNN's packed linear (torch built with mkldnn), whose "
                "rows do not depend on the batch; this torch build lacks it")
    return None


def check_config(config) -> None:
    """Raise ValueError where an EngineConfig with ``batch_invariant=True`` cannot keep the promise."""
    reason = supported(config.dtype, config.device)
    if reason is not None:
        raise ValueError(reason)
    if config.attention_backend not in ("auto", "torch"):
        raise ValueError(f"batch_invariant=True attends through its own CPU kernel; attention_backend="
                         f"{config.attention_backend!r} cannot be honoured: leave it at 'auto' or 'torch'")


def invariant_graph_mode(graph_mode: str) -> str:
    """The graph mode under the mode: steps run eager. A compiled step's fused kernels round
    differently from the eager ones, so a token's numbers would depend on whether a bucket took its
    step; graph_mode='compile' asked for by name is a WARNING."""
    if graph_mode == "compile":
        warning_once(logger, "batch_invariant=True runs every step eagerly: graph_mode='compile' is not "
                     "used (compiled steps round differently from eager ones, which would make a "
                     "token's numbers depend on the step that ran it)")
        return "none"
    return "none" if graph_mode == "auto" else graph_mode


def apply(model: torch.nn.Module) -> None:
    """Switch a loaded, fused model (model/decoder.py; a tensor-parallel shard too, whose all-reduces
    then sum in rank order) to the mode's kernels; raises RuntimeError when a projection's rows would
    depend on the batch on this machine (the probe, per weight shape)."""
    from minirunner.model.decoder import FusedLinear

    checked: dict[tuple[int, int], int] = {}
    for module in model.modules():
        for value in vars(module).values():
            fused = getattr(value, "linear", value)  # a row-parallel projection holds its FusedLinear
            if not isinstance(fused, FusedLinear):
                continue
            shape = tuple(fused.weight.shape)
            if shape not in checked:
                checked[shape] = fewest_rows(fused.packed, shape[1], shape[0])
            if not checked[shape]:
                raise RuntimeError(f"batch_invariant=True: a {shape[0]}x{shape[1]} projection's rows "
                                   "depend on the batch with this CPU's oneDNN kernels; leave the mode "
                                   "off on this machine")
            fused.invariant = checked[shape]
    head = InvariantLinear(model.lm_head.weight)
    if not head.min_rows:
        raise RuntimeError("batch_invariant=True: lm_head's rows depend on the batch with this CPU's "
                           "oneDNN kernels; leave the mode off on this machine")
    if hasattr(model.lm_head, "project"):  # tensor parallel: this rank's rows, then the all-gather
        model.lm_head.project = head
    else:
        model.lm_head.forward = head
    model.rotary = InvariantRotary(model.rotary)
    tp = getattr(model, "tp", None)
    if tp is not None:
        tp.fixed_order = True


def describe() -> str:
    """What the mode changes, for the log line at start."""
    return (f"batch-invariant mode: projections and lm_head through oneDNN's packed linear (one row "
            f"padded to {MIN_ROWS} where one row meets another kernel), RoPE from a table, every query "
            "row's attention through one CPU kernel with one reduction order over keys (prefill, "
            "chunked prefill, decode and verify alike), tensor-parallel sums in rank order, steps eager "
            "(no compiled graphs)")


__all__ = ["InvariantLinear", "InvariantRotary", "apply", "check_config", "check_rows", "describe",
           "fewest_rows", "invariant_graph_mode", "linear", "supported"]

"""The padded batch ladder of graph-captured decode: which captured batch size a decode batch runs at.

Owns the default capture sizes and the rounding-up rule, as plain Python with no imports of ours, so
both the launch simulator and the runner can use the one definition. It never decides whether a step
runs captured or eager beyond "no bucket is large enough" (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence

SMALL_SIZES = (1, 2, 4, 8)  # below 8 the ladder doubles; above it, one rung every 8 rows
STRIDE = 8


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The default ladder: 1, 2, 4, 8, then every multiple of 8 up to ``max_num_seqs``.

    ``capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]``. Batches above the largest rung run eager.
    """
    if not isinstance(max_num_seqs, int) or isinstance(max_num_seqs, bool) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be a positive int, got {max_num_seqs!r}")
    sizes = [s for s in SMALL_SIZES if s <= max_num_seqs]
    sizes += list(range(2 * STRIDE, max_num_seqs + 1, STRIDE))
    return sizes


def check_ladder(ladder: Sequence[int]) -> list[int]:
    """The ladder sorted and checked: positive ints, no repeats. Raises ValueError saying what is wrong."""
    sizes = list(ladder)
    if not sizes:
        raise ValueError("the capture-size ladder is empty: give at least one batch size, e.g. [1, 2, 4, 8]")
    bad = [s for s in sizes if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        raise ValueError(f"capture sizes must be positive ints; got {bad[:3]}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"capture sizes {sizes} repeat a size; list each size once")
    return sorted(sizes)


def padded_batch_size(batch_size: int, ladder: Sequence[int] | None = None,
                      max_num_seqs: int = 512) -> int | None:
    """The smallest rung of ``ladder`` that holds ``batch_size`` rows, or None if none does (eager).

    ``ladder`` defaults to ``capture_sizes(max_num_seqs)``. Example: 17 on [1, 2, 4, 8, 16, 24, 32] -> 24,
    so 7 padding rows run with the batch.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    sizes = capture_sizes(max_num_seqs) if ladder is None else check_ladder(ladder)
    return next((s for s in sizes if s >= batch_size), None)

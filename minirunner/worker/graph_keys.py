"""The two ladders of graph steps: the bucket ladder (how many rows a replayed step pads a batch to) and
the context ladder of compiled steps (how many block-table columns a compiled step attends over).

Owns the bucket rule (``capture_sizes``, ``bucket_for``), the rung rule (64 tokens' worth of columns,
then doubling, capped at the table width) and the narrowed metadata a compiled step reads (the first
``columns`` columns of the static block tables), so a compiled step whose attention runs over a padded
width (verify steps; decode steps where the C decode kernel is not built) gathers the keys its batch
needs rounded up to a rung, not the whole table width. A decode step through the C kernel reads each row
up to its own length and is compiled at the full width only (cudagraph.py, ``_columns``). It never
writes a buffer and never compiles anything (worker/cudagraph.py does).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

from minirunner.attention.metadata import AttentionMetadata
from minirunner.kv.block_table import cdiv

# The first rung: the embedded model's prompts and a few dozen decoded tokens fit in it.
FIRST_RUNG_TOKENS = 64


def first_rung(block_size: int) -> int:
    """Block-table columns of the lowest rung: ``FIRST_RUNG_TOKENS`` tokens' worth, at least one."""
    return max(1, cdiv(FIRST_RUNG_TOKENS, block_size))


def context_columns(max_seq_len: int | None, block_size: int, max_blocks_per_seq: int) -> int:
    """The rung a batch whose longest sequence holds ``max_seq_len`` tokens (this step's included)
    attends over: the first rung, doubled until it covers the sequence, capped at ``max_blocks_per_seq``
    (None: the full width)."""
    if max_seq_len is None:
        return max_blocks_per_seq
    need = cdiv(max(int(max_seq_len), 1), block_size)
    rung = first_rung(block_size)
    while rung < need:
        rung *= 2
    return min(rung, max_blocks_per_seq)


def context_ladder(block_size: int, max_blocks_per_seq: int) -> list[int]:
    """Every rung, lowest first (the last one is the full table width)."""
    rungs = [min(first_rung(block_size), max_blocks_per_seq)]
    while rungs[-1] < max_blocks_per_seq:
        rungs.append(min(rungs[-1] * 2, max_blocks_per_seq))
    return rungs


def narrow_context(meta: AttentionMetadata, columns: int) -> AttentionMetadata:
    """``meta`` (a graph step's static metadata) over the first ``columns`` block-table columns only:
    views of the same storage, so a compiled step still reads what the buffers hold at replay."""
    if columns >= meta.block_tables.shape[1]:
        return meta
    host = meta.block_tables_cpu
    return dataclasses.replace(meta, block_tables=meta.block_tables[:, :columns],
                               block_tables_cpu=None if host is None else host[:, :columns],
                               max_seq_len=columns * meta.block_size)


def capture_sizes(max_num_seqs: int, sizes: Sequence[int] | None = None) -> list[int]:
    """The bucket ladder: ``sizes`` (sorted, deduplicated, checked), or by default [1, 2, 4, 8] then
    multiples of 8 up to ``max_num_seqs`` (vLLM's default ladder shape)."""
    if sizes is None:
        ladder = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
        return ladder + list(range(16, max_num_seqs + 1, 8))
    sizes = list(sizes)
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise ValueError(f"cudagraph_capture_sizes must be a non-empty list of integers >= 1, got {sizes!r}")
    too_big = [s for s in sizes if s > max_num_seqs]
    if too_big:
        raise ValueError(f"cudagraph_capture_sizes {too_big} exceed max_num_seqs={max_num_seqs}: a decode "
                         "batch never gets that large; drop them or raise max_num_seqs")
    return sorted(set(sizes))


def bucket_for(batch_size: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size >= batch_size, or None (the batch runs eager). ``sizes`` sorted."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None

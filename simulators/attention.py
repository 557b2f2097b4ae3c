"""Decode attention as numbers a student can check by hand: the online softmax over chunks, the split-KV
merge by log-sum-exp, a paged read through a block table with GQA grouping, the bytes each way of computing
it moves, and how its programs fill a GPU's SMs (notebook 08).

Owns the numpy forms of these mechanisms (the references the notebook sets beside the runner's C kernel,
Triton kernel and torch twin), the bytes-and-overhead model of three decode paths, the program timeline
(one thread block per (sequence, head) or per split, handed to SMs in order), and the reader of the H200
run's kernel figure with each block's status. Pure numpy and json: never imports torch or the runner; the
runner's twins come in as function arguments.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["online_softmax_attention", "split_partials", "merge_partials", "PagedKV", "paged_decode_grouped",
           "DecodeShape", "path_bytes", "fit_path", "schedule_programs", "Program", "kernel_report",
           "bits_differ", "ulp_distance"]

REPORT_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_check_h200.json"


# ---------------------------------------------------------------------------------------------
# The mechanisms, one query head at a time (q [D], k and v [L, D])

def online_softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                             chunk: int) -> tuple[np.ndarray, float, float]:
    """softmax(q . k * scale) @ v over chunks of ``chunk`` keys, keeping only a running max m, a running
    sum l (both relative to m) and an unnormalised output acc; returns (acc / l, m, l). The arithmetic is
    in the inputs' dtype (float32 in, float32 throughout), so the chunk size changes the rounding."""
    dt = np.result_type(q, k, v)
    m, l_sum = dt.type(-np.inf), dt.type(0)
    acc = np.zeros(v.shape[1], dtype=dt)
    for t0 in range(0, len(k), chunk):
        s = (k[t0:t0 + chunk] @ q) * dt.type(scale)
        m_new = max(m, s.max())
        alpha = np.exp(m - m_new)  # rescale what was summed against the old max (0 on the first chunk)
        p = np.exp(s - m_new)
        l_sum = l_sum * alpha + p.sum()
        acc = acc * alpha + p @ v[t0:t0 + chunk]
        m = m_new
    return acc / l_sum, float(m), float(l_sum)


def split_partials(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                   num_splits: int) -> list[tuple[np.ndarray, float]]:
    """Split-KV: the keys cut into ``num_splits`` contiguous ranges; for each, (its own normalised output,
    its log-sum-exp of the scores), as a split program writes them. An empty range gives (zeros, -inf)."""
    parts = []
    bounds = np.linspace(0, len(k), num_splits + 1).round().astype(int)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi == lo:
            parts.append((np.zeros(v.shape[1]), -math.inf))
            continue
        s = (k[lo:hi] @ q).astype(np.float64) * scale
        m = s.max()
        p = np.exp(s - m)
        parts.append(((p @ v[lo:hi]) / p.sum(), float(m + np.log(p.sum()))))
    return parts


def merge_partials(parts: list[tuple[np.ndarray, float]]) -> np.ndarray:
    """The log-sum-exp merge: out = sum_i exp(lse_i - lse) o_i with lse = log sum_i exp(lse_i), computed
    against the largest lse_i so nothing overflows; empty splits (lse -inf) weigh nothing."""
    lse = np.array([p[1] for p in parts], dtype=np.float64)
    m = lse.max()
    w = np.exp(lse - m)
    return sum(wi * np.asarray(o, dtype=np.float64) for wi, (o, _) in zip(w, parts, strict=True)) / w.sum()


class PagedKV:
    """A paged KV cache ``[num_blocks, 2, block_size, num_kv_heads, head_dim]`` that can only be read one
    (block, KV head) at a time, and counts the reads: ``read(block, kv_head) -> (k [block_size, D],
    v [block_size, D])``. ``reads`` counts every call; a kernel that reads each block once per KV head
    (not once per query head) makes blocks x num_kv_heads of them."""

    def __init__(self, cache: np.ndarray):
        self._cache = np.asarray(cache)
        self.num_blocks, _, self.block_size, self.num_kv_heads, self.head_dim = self._cache.shape
        self.reads = 0

    def read(self, block: int, kv_head: int) -> tuple[np.ndarray, np.ndarray]:
        block, kv_head = int(block), int(kv_head)
        if not (0 <= block < self.num_blocks and 0 <= kv_head < self.num_kv_heads):
            raise IndexError(f"read({block}, {kv_head}) is outside the cache ({self.num_blocks} blocks, "
                             f"{self.num_kv_heads} KV heads)")
        self.reads += 1
        return self._cache[block, 0, :, kv_head].copy(), self._cache[block, 1, :, kv_head].copy()


def paged_decode_grouped(q: np.ndarray, kv: PagedKV, block_table, seq_len: int, scale: float) -> np.ndarray:
    """One sequence's decode attention, q [num_q_heads, D] -> [num_q_heads, D], reading each block of its
    table once per KV head and using it for the whole group of query heads that share that KV head
    (query head h reads KV head h // (num_q_heads // num_kv_heads))."""
    hq, d = q.shape
    group = hq // kv.num_kv_heads
    num_blocks = -(-seq_len // kv.block_size)
    out = np.zeros((hq, d))
    for h in range(kv.num_kv_heads):
        ks, vs = zip(*(kv.read(block_table[j], h) for j in range(num_blocks)), strict=True)
        k, v = np.concatenate(ks)[:seq_len], np.concatenate(vs)[:seq_len]
        s = q[h * group:(h + 1) * group] @ k.T * scale  # the group's rows share one read of K and V
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[h * group:(h + 1) * group] = (p / p.sum(axis=1, keepdims=True)) @ v
    return out


def bits_differ(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements of two float arrays differ in at least one bit."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return int((a.view(np.uint8).reshape(a.size, -1) != b.view(np.uint8).reshape(b.size, -1)).any(1).sum())


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in float32 units in the last place between two arrays (0: bit-identical)."""
    ia = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, np.int64(-2**31) - ia, ia)  # order the negative floats after the positive ones
    ib = np.where(ib < 0, np.int64(-2**31) - ib, ib)
    return int(np.abs(ia - ib).max())


# ---------------------------------------------------------------------------------------------
# The bytes model: what three decode paths move, and a fixed cost per call

@dataclass(frozen=True)
class DecodeShape:
    """One decode attention call: batch sequences of context tokens each, q_heads query heads sharing
    kv_heads KV heads of head_dim, elem bytes per value (4: float32)."""

    batch: int
    context: int
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    elem: int = 4

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def kv_bytes(self) -> int:
        """K and V of every sequence, each read once: the least any kernel moves."""
        return self.batch * self.context * 2 * self.kv_heads * self.head_dim * self.elem

    @property
    def score_bytes(self) -> int:
        """One score per (sequence, query head, key)."""
        return self.batch * self.q_heads * self.context * self.elem


def path_bytes(shape: DecodeShape, path: str) -> int:
    """Bytes a path moves through memory, by its own steps:

    - "naive" (gather, then scores, softmax, output): the gather reads K and V and writes a copy (2x),
      the two matmuls read the copy (1x); the score matrix is written, masked, softmaxed and read back
      (about 6 passes over it);
    - "chunked" (the C kernel: the online softmax over 64-key chunks, reading through the block table):
      K and V once from memory; its re-reads for the other query heads of a group hit the cache while one
      sequence's K and V for one head fit in it (the model assumes they do); no score matrix;
    - "twin" (paged_decode_ref, one sequence at a time): the gather (2x), GQA by repeating each KV head for
      its group (reads 1x, writes group x), the two products read the repeated copy (group x), scores as
      in naive.
    """
    kv, sc = shape.kv_bytes, shape.score_bytes
    if path == "naive":
        return 3 * kv + 6 * sc
    if path == "chunked":
        return kv
    if path == "twin":
        return (3 + 2 * shape.group) * kv + 6 * sc
    raise ValueError(f"path must be 'naive', 'chunked' or 'twin', got {path!r}")


def fit_path(points: list[tuple[int, float]]) -> tuple[float, float]:
    """A path's two terms from measured points (bytes, seconds): the fixed cost c0 (seconds per call) and
    the bandwidth it reaches (bytes per second), time = c0 + bytes / bandwidth, fitted by least squares on
    the relative error (so a 10 us point counts as much as a 100 ms one), neither term negative."""
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    if len(points) < 2 or np.ptp(b) == 0 or np.any(t <= 0):
        raise ValueError("fit_path needs at least two points of different bytes and positive times")
    w = 1.0 / t
    (c0, per_byte), *_ = np.linalg.lstsq(np.c_[w, b * w], np.ones_like(t), rcond=None)
    if c0 < 0:  # no fixed cost: the slope alone
        c0, per_byte = 0.0, float(np.sum(b * w * w) / np.sum((b * w) ** 2))
    if per_byte <= 0:  # no bytes term: the fixed cost alone
        return float(np.sum(w) / np.sum(w * w)), math.inf
    return float(c0), float(1.0 / per_byte)


# ---------------------------------------------------------------------------------------------
# Programs on SMs: one thread block per (sequence, head), or per split of a sequence's keys

@dataclass(frozen=True)
class Program:
    """One program (thread block) of a launch: which SM ran it, when, and what it owned."""

    sm: int
    start: float
    end: float
    seq: int
    head: int
    split: int


def schedule_programs(batch: int, heads: int, context: int, num_splits: int = 1, sms: int = 8,
                      per_token: float = 1.0, per_program: float = 0.0) -> list[Program]:
    """The launch grid (batch, heads, num_splits), handed to ``sms`` SMs in order, each SM taking the next
    program when it is free (one program per SM at a time). A program's time is per_program + per_token x
    the keys it reads (its split's share of ``context``). Returns the programs; the launch ends at the
    last one's end."""
    if min(batch, heads, num_splits, sms) < 1 or context < 0:
        raise ValueError("batch, heads, num_splits and sms must be >= 1 and context >= 0")
    bounds = np.linspace(0, context, num_splits + 1).round().astype(int)
    free = [(0.0, sm) for sm in range(sms)]
    heapq.heapify(free)
    out = []
    for seq in range(batch):
        for head in range(heads):
            for split in range(num_splits):
                start, sm = heapq.heappop(free)
                end = start + per_program + per_token * float(bounds[split + 1] - bounds[split])
                out.append(Program(sm, start, end, seq, head, split))
                heapq.heappush(free, (end, sm))
    return out


# ---------------------------------------------------------------------------------------------
# The H200 run's kernel figure, with the status of every block of that run

def kernel_report(path: str | Path | None = None) -> dict | None:
    """The paged-decode figure of the committed H200 report (``scripts/gpu_check.sh``'s report file) and
    the status of each of the run's blocks: {"decode": {...}, "copy_GBps": float, "blocks": {name:
    "passed" | "failed (rc N)" | "timed out"}, "tests": summary}. None when no report is committed."""
    p = Path(path) if path is not None else REPORT_PATH
    if not p.exists():
        return None
    doc = json.loads(p.read_text(encoding="utf-8"))
    blocks = {}
    for name, block in doc.items():
        if isinstance(block, dict) and "rc" in block:
            rc = block["rc"]
            blocks[name] = ("timed out" if block.get("timed_out") else "passed" if rc == 0
                            else f"failed (rc {rc})")
    bench = doc.get("kernel_bench", {})
    return {"decode": bench.get("decode_attention"), "copy_GBps": bench.get("copy_bandwidth_GBps"),
            "blocks": blocks, "tests": doc.get("gpu_tests", {}).get("summary"), "env": doc.get("env", {})}

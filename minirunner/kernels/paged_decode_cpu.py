"""The CPU's decode attention kernel (paged_decode_cpu.c): built once per machine, loaded, and called.

A compiled CPU decode step (graph_mode="compile") attends through it: a loop bounded by each sequence's
length, where the torch formulations attend over a padded width (every row to its rung, or a gathered
copy first). It is the twin of ``paged_attention_ref.paged_decode_ref`` (same arguments and result, float32
only). Built with the system's C compiler (``CC``, else cc, gcc or clang), for this machine's
instruction set, into the folder the caller names, under a name keyed by the source, the flags, the
compiler and the CPU; built at most once per process, on first use. Where no compiler builds it,
``load`` says False and callers keep their torch form. Nothing here imports minirunner.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("paged_decode_cpu.c")
FLAG_SETS = (["-O3", "-march=native", "-fopenmp-simd"], ["-O3"])  # the second where native is refused
_lock = threading.Lock()
_state: dict = {}  # "fn": the loaded function, or None once a build failed in this process


def _cpu_id() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        first = (next((line for line in info if line.startswith(key)), "") for key in ("model name", "flags"))
        return "|".join(first)
    except OSError:
        return platform.processor()


def _build(folder: Path):
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        logger.info("no C compiler: the CPU decode kernel is not built (compiled steps keep torch's form)")
        return None
    source = SOURCE.read_bytes()
    for flags in FLAG_SETS:
        parts = [source, " ".join(flags).encode(), cc.encode(), platform.machine().encode(),
                 _cpu_id().encode()]
        key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:20]
        path = folder / f"paged_decode_cpu-{key}.so"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
            cmd = [cc, *flags, "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                os.unlink(tmp)
                logger.info("building the CPU decode kernel with %s failed: %s", flags,
                            done.stderr.strip()[-500:])
                continue
            os.replace(tmp, path)  # atomic: a process beside this one loads a whole file or builds its own
        fn = ctypes.CDLL(str(path)).paged_decode_f32
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 7 + [ctypes.c_float]
        return fn
    return None


def load(folder: Path) -> bool:
    """Build (or find built in ``folder``) and load the kernel, once per process; False where it cannot
    be built here (the reason is logged)."""
    with _lock:
        if "fn" not in _state:
            try:
                _state["fn"] = _build(Path(folder))
            except OSError as err:  # an unwritable folder, a compiler that cannot start
                logger.info("the CPU decode kernel is unavailable: %s", err)
                _state["fn"] = None
        return _state["fn"] is not None


def supports(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
             seq_lens: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors as they are: float32 q and cache on the CPU, a contiguous
    cache, int32 tables with contiguous rows and int32 contiguous lengths."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and kv_cache.dtype == torch.float32
            and kv_cache.is_contiguous() and block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
            and seq_lens.dtype == torch.int32 and seq_lens.is_contiguous())


def paged_decode_cpu(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """``paged_decode_ref``'s attention by the C kernel (after ``load`` said True, on tensors ``supports``
    takes). Returns [num_seqs, num_q_heads, head_dim], contiguous."""
    q = q.contiguous()
    out = torch.empty_like(q)
    s, hq, d = q.shape
    _, _, bs, hkv, _ = kv_cache.shape
    _state["fn"](q.data_ptr(), kv_cache.data_ptr(), block_tables.data_ptr(), seq_lens.data_ptr(),
                 out.data_ptr(), s, hq, hkv, d, bs, block_tables.stride(0), block_tables.shape[1], scale)
    return out

"""The CPU's decode attention kernel (paged_decode_cpu.c): built once per machine and folder, loaded, called.

A compiled CPU decode step (graph_mode="compile") attends through it: a loop bounded by each sequence's
length, where the torch formulations attend over a padded width (every row to its rung, or a gathered
copy first). It is the twin of ``paged_attention_ref.paged_decode_ref`` (same arguments and result, float32
only). Built with the system's C compiler (``CC``, split like a shell word list so ``CC="ccache gcc"``
works; else cc, gcc or clang), for this machine's instruction set, into the folder the caller names,
under a name keyed by the source, the flags, the compiler and the CPU.

The build is bounded (``BUILD_TIMEOUT_S``; the compiler's whole process group is killed past it), writes a
temporary file in the target folder and renames it into place (a process beside this one loads a whole
file or builds its own); the temporary file is removed on any failure, and one left by a killed process is
removed by the next build. The library is loaded only from a folder owned by this user that neither group
nor others may write (else anyone who can write there could plant code). The outcome is kept per folder
and compiler, so a later engine naming another folder gets its own. Where the kernel is not available,
``load`` says False, a WARNING says why (once), and callers keep their torch form. Each call checks the
block ids it reads (in C, before reading any): a bad one raises IndexError naming it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from minirunner import envs
from minirunner.log import warning_once

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("paged_decode_cpu.c")
FLAG_SETS = (["-O3", "-march=native", "-fopenmp-simd"], ["-O3"])  # the second where native is refused
BUILD_TIMEOUT_S = 120.0  # one compile of a small file takes about a second
TMP_PREFIX = ".paged_decode_cpu-"
TMP_SUFFIX = ".tmp"
_lock = threading.Lock()
_loaded: dict[tuple[str, tuple[str, ...]], Callable | None] = {}  # (folder, compiler) -> fn or None
_state: dict = {}  # "fn": a loaded kernel (every build is the same code), for paged_decode_cpu


class KernelUnavailable(Exception):
    """Why the kernel cannot be built or loaded here (said once as a WARNING; callers keep torch's form)."""


def _cpu_id() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        first = (next((line for line in info if line.startswith(key)), "") for key in ("model name", "flags"))
        return "|".join(first)
    except OSError:
        return platform.processor()


def compiler() -> list[str] | None:
    """The compiler's command words: ``CC`` split like a shell word list, else cc, gcc or clang; None
    where there is none."""
    if envs.CC is not None:
        return shlex.split(envs.CC)
    found = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    return None if found is None else [found]


def check_private(path: Path) -> None:
    """Raise KernelUnavailable unless ``path`` is owned by this user and not writable by group or others."""
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise KernelUnavailable(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})")
    if st.st_mode & 0o022:
        raise KernelUnavailable(f"{path} is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
                                f"(mode {st.st_mode & 0o777:o}): fix it with chmod go-w {path}, or set "
                                "MINIRUNNER_COMPILE_CACHE to a folder of your own")


def _remove_stale_temps(folder: Path) -> None:
    """Remove the temporary files of builds whose process is gone (killed mid-build)."""
    for tmp in folder.glob(f"{TMP_PREFIX}*{TMP_SUFFIX}"):
        try:
            pid = int(tmp.name[len(TMP_PREFIX):].split(".")[1])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError):  # not ours to parse, or its process is gone
            tmp.unlink(missing_ok=True)
        except PermissionError:  # a live process of another user
            pass


def _compile(cmd: list[str], timeout_s: float) -> tuple[int, str]:
    """Run the compiler in its own process group; on timeout kill the whole group. (returncode, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except BaseException:  # the timeout, or an interrupt: no compiler outlives the build
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, AttributeError):
            proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


def _build(folder: Path, cc: list[str], timeout_s: float) -> Callable:
    """Build (or find built) and load the kernel in ``folder``; raises KernelUnavailable saying why."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(folder)
    _remove_stale_temps(folder)
    source = SOURCE.read_bytes()
    errors = []
    for flags in FLAG_SETS:
        parts = [source, " ".join(flags).encode(), "\0".join(cc).encode(), platform.machine().encode(),
                 _cpu_id().encode()]
        key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:20]
        path = folder / f"paged_decode_cpu-{key}.so"
        if not path.exists():
            fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{key}.{os.getpid()}.", suffix=TMP_SUFFIX,
                                       dir=folder)
            os.close(fd)
            try:
                cmd = [*cc, *flags, "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"]
                try:
                    code, err = _compile(cmd, timeout_s)
                except subprocess.TimeoutExpired:
                    raise KernelUnavailable(f"{shlex.join(cc)} did not finish in {timeout_s:g} s") from None
                if code != 0:
                    errors.append(f"{shlex.join(cc)} {' '.join(flags)}: {err.strip()[-500:]}")
                    continue
                os.chmod(tmp, 0o700)
                os.replace(tmp, path)  # atomic: a process beside this one loads a whole file, or builds
            finally:
                Path(tmp).unlink(missing_ok=True)  # gone already after the rename
        check_private(path)
        fn = ctypes.CDLL(str(path)).paged_decode_f32
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 7 + [ctypes.c_float, ctypes.c_int64,
                                                                      ctypes.c_void_p]
        return fn
    raise KernelUnavailable("the build failed: " + " | ".join(errors))


def load(folder: Path, timeout_s: float = BUILD_TIMEOUT_S) -> bool:
    """Build (or find built in ``folder``) and load the kernel, once per folder and compiler in this
    process; False where it cannot be built or loaded here (a WARNING, once, says why)."""
    folder = Path(folder).expanduser().absolute()
    cc = compiler()
    key = (str(folder), tuple(cc or ()))
    with _lock:
        if key not in _loaded:
            fn = None
            try:
                if cc is None:
                    raise KernelUnavailable("no C compiler: set CC, or install cc, gcc or clang")
                fn = _build(folder, cc, timeout_s)
            except (KernelUnavailable, OSError) as err:  # OSError: an unwritable folder, a missing compiler
                warning_once(logger, "the CPU decode kernel is not used (compiled decode steps attend "
                             "with torch's form, slower): %s", err)
            _loaded[key] = fn
            if fn is not None:
                _state["fn"] = fn
        return _loaded[key] is not None


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
    takes). Returns [num_seqs, num_q_heads, head_dim], contiguous. Raises IndexError naming the first
    block id a sequence reads outside [0, kv_cache.shape[0]) (nothing is read then)."""
    q = q.contiguous()
    out = torch.empty_like(q)
    s, hq, d = q.shape
    num_blocks, _, bs, hkv, _ = kv_cache.shape
    bad = (ctypes.c_int64 * 3)()
    if _state["fn"](q.data_ptr(), kv_cache.data_ptr(), block_tables.data_ptr(), seq_lens.data_ptr(),
                    out.data_ptr(), s, hq, hkv, d, bs, block_tables.stride(0), block_tables.shape[1], scale,
                    num_blocks, bad):
        row, column, block = bad
        raise IndexError(f"paged_decode_cpu: sequence {row} reads block id {block} (column {column} of its "
                         f"block table), outside the KV cache's {num_blocks} blocks [0, {num_blocks}): "
                         "the block table is wrong (a bookkeeping bug), so nothing was read")
    return out

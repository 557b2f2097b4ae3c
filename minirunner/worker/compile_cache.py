"""The on-disk cache of compiled steps (graph_mode="compile"): where torch keeps them across processes.

Owns the folder (``MINIRUNNER_COMPILE_CACHE``, default ``~/.cache/minirunner/compile/torch-<version>``), its
checks (a folder this process can write, else a ValueError saying what to do) and the scope that points
torch's compile caches at it (``TORCHINDUCTOR_CACHE_DIR``) only while an engine works, restored after
(minirunner/engine_scope.py): a caller's own ``torch.compile`` keeps its folder. Entries are keyed by
torch itself (the traced graph, its shapes, dtypes and strides, the compile options, the torch
version), so a change of model architecture, bucket or torch version misses; weights are inputs of
the compiled step, never baked into it. It never compiles anything and never deletes an entry.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from minirunner import envs

ENV_VAR = "MINIRUNNER_COMPILE_CACHE"
# No inductor freezing: it folds the weights into each compiled step as constants, and on a warm start
# re-runs its passes on every step before the cache lookup (seconds per key), for no step time it saves
# on the embedded model (benchmarks/README.md, "Freezing"). A C++ wrapper: the code that calls a compiled
# step's kernels runs in C++, not Python (the decode step's Python overhead; "C++ wrapper" there).
COMPILE_OPTIONS: dict = {"cpp_wrapper": True}
logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """~/.cache/minirunner/compile/torch-<torch version> (the version's '+' local tag kept)."""
    return Path.home() / ".cache" / "minirunner" / "compile" / f"torch-{torch.__version__}"


def cache_dir() -> Path:
    """The folder compiled steps are cached in: ``MINIRUNNER_COMPILE_CACHE`` when set, else the default.
    Checked, not created."""
    value = envs.MINIRUNNER_COMPILE_CACHE
    if value is None:
        return default_cache_dir()
    return Path(value).expanduser()


def configure_compile_cache() -> Path:
    """Create and check the cache folder; returns it (resolved). Changes no process state: the engine
    points torch at the folder only around its own work (``inductor_cache_dir``). Raises ValueError
    naming ``MINIRUNNER_COMPILE_CACHE`` when the folder is a file or cannot be written."""
    path = cache_dir()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{ENV_VAR}={str(path)!r} is a file, not a folder: set {ENV_VAR} to a folder "
                         "(it is created if missing), or unset it for the default "
                         f"{default_cache_dir()}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{ENV_VAR}={str(path)!r} cannot be created ({err.strerror}): set {ENV_VAR} "
                         "to a folder you can write, or unset it for the default") from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{ENV_VAR}={str(path)!r} is not writable: set {ENV_VAR} to a folder you can "
                         "write, or unset it for the default")
    path = path.resolve()
    logger.info("compiled steps cached in %s", path)
    return path


@contextmanager
def inductor_cache_dir(path: Path) -> Iterator[None]:
    """Point torch's on-disk compile caches (inductor's FX graph cache, AOT autograd's; torch keeps both
    on by default) at ``path`` for the body, then put ``TORCHINDUCTOR_CACHE_DIR`` back as it was
    (unset included). Torch reads the variable at each compile; it is process-wide while the body runs,
    so a compile in another thread at that moment lands in ``path`` too (and inductor's compile worker
    processes, if first started inside, keep the folder they started with)."""
    with envs.temporarily("TORCHINDUCTOR_CACHE_DIR", str(path)):
        yield

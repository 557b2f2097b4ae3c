"""nbval harness for the course notebooks: cells tagged ``gpu`` are skipped when CUDA is absent.

Owns only collection-time decisions about notebook cells; it never changes what a cell runs or what
output it is compared against (that is the notebook's and ``sanitize.cfg``'s job).
"""

from __future__ import annotations

import functools

import pytest

GPU_TAG = "gpu"


@functools.cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _cell_tags(item) -> list[str]:
    cell = getattr(item, "cell", None)  # nbval's IPyNbCell keeps the notebook cell here
    if cell is None:
        return []
    return list(cell.get("metadata", {}).get("tags", []))


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if GPU_TAG in _cell_tags(item)]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="GPU cell skipped: no CUDA device")
        for item in gpu_items:
            item.add_marker(skip)

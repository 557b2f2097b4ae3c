"""The start-up heap kept out of the garbage collector's way (vLLM's engine core does the same).

Owns one process-wide choice: when the first engine is built, everything alive then (torch, transformers
and minirunner's own modules: hundreds of thousands of objects) is collected once and moved to the
collector's permanent generation, so the collections a decode loop's small allocations trigger no longer
walk it. Objects created later, engines included, are collected as usual; at exit the heap is handed
back, so the interpreter's last collection sees everything.
"""

from __future__ import annotations

import atexit
import gc
import logging

logger = logging.getLogger(__name__)
_frozen = False


def freeze_startup_heap() -> None:
    """Collect, then freeze what is alive (once per process; later calls do nothing)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    logger.debug("start-up heap frozen: %d objects out of the collector's generations", gc.get_freeze_count())


class FreezesStartupHeap:
    """A base for the objects a program builds an engine through (``LLM``, ``LLMEngine``): the heap is
    frozen before the first of them exists, so they, and everything they build, stay collectable."""

    def __new__(cls, *args, **kwargs):
        freeze_startup_heap()
        return super().__new__(cls)

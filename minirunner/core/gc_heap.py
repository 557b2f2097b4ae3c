"""The start-up heap kept out of the garbage collector's way: a choice only the entry points make.

Owns one process-wide action, ``freeze_startup_heap``: everything alive (torch, transformers, the model,
the engine: hundreds of thousands of objects) is collected once and moved to the collector's permanent
generation, so the collections a decode loop's small allocations trigger no longer walk it (vLLM's engine
core and API server do the same). Frozen objects are never collected, even once they are garbage, so a
library must not do this to its caller: building an ``LLM`` or an ``LLMEngine`` never calls it. The
CLI's ``generate`` and ``bench`` and the server call it once, after start-up, for a process that lives
for that one job. At exit the heap is handed back, so the interpreter's last collection sees everything.
"""

from __future__ import annotations

import atexit
import gc
import logging

logger = logging.getLogger(__name__)
_frozen = False


def freeze_startup_heap() -> None:
    """Collect, then freeze what is alive (once per process; later calls do nothing). For entry points
    only (the module docstring says why)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    logger.debug("start-up heap frozen: %d objects out of the collector's generations", gc.get_freeze_count())

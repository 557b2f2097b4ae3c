"""Logging: what the entry points show, and warnings said once.

Owns ``configure_logging``, which only the entry points call (the CLI's generate and bench, the server:
``--log-level``): minirunner's loggers then print to stderr at that level and above. A library leaves
logging to its caller, so ``LLM(...)`` configures nothing; a program that wants the messages calls
``logging.basicConfig`` (or this). ``warning_once`` is for a fallback from a fast path (a kernel that
did not build, a backend that is not usable): a WARNING, said once per process, that the user sees by
default.
"""

from __future__ import annotations

import logging
import sys
import threading

LOG_LEVELS = ("debug", "info", "warning", "error")
_lock = threading.Lock()
_said: set[tuple[str, str]] = set()
_HANDLER_NAME = "minirunner-entry-point"


def configure_logging(level: str = "warning") -> None:
    """Print minirunner's log records at ``level`` and above to stderr, as "LEVEL name: message" (for
    entry points; calling it again changes the level, it adds no second handler)."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {list(LOG_LEVELS)}, got {level!r}")
    root = logging.getLogger("minirunner")
    root.setLevel(level.upper())
    if not any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


def warning_once(logger: logging.Logger, message: str, *args) -> None:
    """``logger.warning(message, *args)`` the first time this text is said in this process; later
    calls with the same text say nothing."""
    key = (logger.name, message % args if args else message)
    with _lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning(message, *args)

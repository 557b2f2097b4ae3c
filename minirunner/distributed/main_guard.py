"""Whether starting worker processes from here would re-run the caller's script in each of them.

Owns the check that a tensor-parallel group is not started from the unguarded top level of a script:
spawned workers import the main script again, so a script that builds ``LLM(tensor_parallel_size=2)``
outside ``if __name__ == "__main__":`` would build it again inside every worker, which Python stops with
a bootstrapping error in the worker. We refuse in the driver instead, before any process starts.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys


def _guarded_lines(source: str) -> list[tuple[int, int]]:
    """The line ranges of every top-level ``if __name__ == "__main__":`` body of a script."""
    ranges = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            sides = [test.left, *test.comparators]
            names = [s.id for s in sides if isinstance(s, ast.Name)]
            values = [s.value for s in sides if isinstance(s, ast.Constant)]
            if names == ["__name__"] and values == ["__main__"]:
                ranges.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
    return ranges


def check_main_guard() -> None:
    """Raise RuntimeError when the call comes from the top level of the main script outside an
    ``if __name__ == "__main__":`` block (a spawned worker would run that line again). An interactive
    session, a notebook or ``python -c`` has no script to re-run, and passes."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return
    # multiprocessing's spawn re-runs neither a package's __main__ (python -m pkg) nor IPython
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if spec_name == "__main__" or spec_name.endswith(".__main__") \
            or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return
    frame = inspect.currentframe()
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return  # not called from the script's own top level (e.g. a test runner, a function run later)
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            ranges = _guarded_lines(f.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return  # cannot read the script: let multiprocessing speak for itself
    if not any(start <= line <= end for start, end in ranges):
        raise RuntimeError(
            f"{path}, line {line}: tensor parallelism starts worker processes that import this script "
            f"again, so the code that starts it must run only in the main process; put it under "
            f'if __name__ == "__main__": (see the README, "Beyond one device")')

"""Strip what changes on every run from the course notebooks, so a re-run touches only real changes.

Removes per-cell execution timestamps (``metadata.execution``, written by nbclient/JupyterLab) and
gives every cell a stable id; keeps outputs and the saved widget state (widgets must render on
opening). ``--check`` only reports (exit 1 if a notebook would change); tests/test_notebook_lint.py
asserts the same thing.

    python scripts/strip_notebook_metadata.py notebooks/*.ipynb
    python scripts/strip_notebook_metadata.py --check notebooks/*.ipynb

To re-execute a notebook with its widget state saved, then strip it:

    (cd notebooks && jupyter nbconvert --to notebook --execute --inplace \\
        --ExecutePreprocessor.store_widget_state=True 01_virtual_memory.ipynb)
    python scripts/strip_notebook_metadata.py notebooks/01_virtual_memory.ipynb
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOLATILE_CELL_KEYS = ("execution",)


def strip(nb: dict) -> dict:
    """The notebook without volatile metadata, every cell with an id (``cell-<index>``)."""
    seen: set[str] = set()
    for i, cell in enumerate(nb.get("cells", [])):
        meta = cell.get("metadata", {})
        for key in VOLATILE_CELL_KEYS:
            meta.pop(key, None)
        cid = cell.get("id")
        if not cid or cid in seen:
            cell["id"] = cid = f"cell-{i}"
        seen.add(cid)
    if nb.get("nbformat") == 4 and nb.get("nbformat_minor", 0) < 5:
        nb["nbformat_minor"] = 5  # cell ids need format 4.5
    return nb


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Strip execution timestamps from notebooks.")
    parser.add_argument("paths", nargs="+", type=Path, help="notebooks to strip")
    parser.add_argument("--check", action="store_true", help="report only; exit 1 if any would change")
    ns = parser.parse_args(argv)
    dirty = []
    for path in ns.paths:
        text = path.read_text(encoding="utf-8")
        new = render(strip(json.loads(text)))
        if new != text:
            dirty.append(path)
            if not ns.check:
                path.write_text(new, encoding="utf-8")
    for path in dirty:
        print(("would strip " if ns.check else "stripped ") + str(path))
    return 1 if ns.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())

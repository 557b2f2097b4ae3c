"""Lint of the course notebooks: the anatomy every notebook promises, and no stale or leaky output.

Checks structure only (objectives, exercise with checker, summary, execution order, no machine
paths); whether the cells run and their outputs match is nbval's job (``pytest notebooks/``).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
# paths that only exist on one machine: home directories, scratch, this project's work tree
_ROOTS = ("work", "root", "home", "tmp", "Users", "private/var")
MACHINE_PATH = re.compile(r"(?<![\w.])(" + "|".join(f"/{r}/" for r in _ROOTS) + r"|[A-Z]:\\Users\\)")
TEXT_MIME = ("text/plain", "text/html", "text/markdown", "application/json")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _output_texts(cell: dict):
    for out in cell.get("outputs", []):
        if "text" in out:
            yield "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
        for mime in TEXT_MIME:
            value = out.get("data", {}).get(mime)
            if value is not None:
                yield "".join(value) if isinstance(value, list) else str(value)
        if "traceback" in out:
            yield "\n".join(out["traceback"])


def test_the_course_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    for expected in ("01_virtual_memory.ipynb", "02_kv_cache_memory.ipynb",
                     "03_block_tables.ipynb", "04_launch_overhead.ipynb", "05_cuda_graphs.ipynb",
                     "06_speculative_decoding.ipynb", "07_model_runner_v2.ipynb",
                     "08_attention_kernels.ipynb", "09_serving_under_load.ipynb"):
        assert expected in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_learning_objectives_at_the_top(path):
    cells = _load(path)["cells"]
    first_code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    intro = "\n".join(_source(c) for c in cells[:first_code] if c["cell_type"] == "markdown")
    assert intro.lstrip().startswith("# "), "the notebook must open with a title"
    start = re.search(r"learning objectives", intro, re.I)
    assert start, "no 'Learning objectives' before the first code cell"
    bullets: list[str] = []
    for line in intro[start.end():].splitlines():
        if line.lstrip().startswith("- "):
            bullets.append(line)
        elif bullets and line.strip():
            break  # the first paragraph after the list ends it
    assert 3 <= len(bullets) <= 5, f"{len(bullets)} objectives; the anatomy asks for 3-5"
    assert re.search(r"prerequisite", intro, re.I), "say what the reader needs first"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_has_a_seeded_exercise_with_a_checker(path):
    code = [_source(c) for c in _load(path)["cells"] if c["cell_type"] == "code"]
    assert any(re.search(r"make_\w*exercise\(\s*seed\s*=", s) for s in code), "no make_exercise(seed=)"
    assert any(".check(" in s for s in code), "no checker call"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_ends_with_a_summary_and_the_next_question(path):
    markdown = [_source(c) for c in _load(path)["cells"] if c["cell_type"] == "markdown"]
    summary = next((m for m in markdown if re.match(r"#+\s*Summary", m.lstrip())), None)
    assert summary is not None, "no '## Summary' section"
    assert "?" in summary, "the summary must end with the question the next notebook answers"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_fresh_and_in_order(path):
    code = [c for c in _load(path)["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    assert None not in counts, "some code cells were never executed: run the notebook top to bottom"
    assert counts == list(range(1, len(code) + 1)), (
        f"execution counts {counts}: restart the kernel and run all cells in order"
    )
    for cell in code:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", "a committed output is an error"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_machine_specific_paths(path):
    for i, cell in enumerate(_load(path)["cells"]):
        texts = [_source(cell), *(_output_texts(cell) if cell["cell_type"] == "code" else [])]
        for text in texts:
            hit = MACHINE_PATH.search(text)
            assert hit is None, f"cell {i} contains a machine path near {text[hit.start():][:60]!r}"


def _strip_script():
    spec = importlib.util.spec_from_file_location(
        "strip_notebook_metadata", NOTEBOOK_DIR.parent / "scripts" / "strip_notebook_metadata.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_execution_timestamps_and_stable_cell_ids(path):
    # re-running a notebook must not touch every cell in the diff: scripts/strip_notebook_metadata.py
    text = path.read_text(encoding="utf-8")
    script = _strip_script()
    assert script.render(script.strip(json.loads(text))) == text, (
        f"run python scripts/strip_notebook_metadata.py notebooks/{path.name}")
    nb = _load(path)
    for i, cell in enumerate(nb["cells"]):
        assert "execution" not in cell.get("metadata", {}), (
            f"cell {i} carries execution timestamps: run scripts/strip_notebook_metadata.py on it")
        assert cell.get("id"), f"cell {i} has no id"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_widget_state_is_saved_so_widgets_render_on_opening(path):
    nb = _load(path)
    uses_widgets = any("ipywidgets" in _source(c) for c in nb["cells"] if c["cell_type"] == "code")
    if uses_widgets:
        state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
        assert state.get("state"), "execute with --ExecutePreprocessor.store_widget_state=True"
        views = [o for c in nb["cells"] for o in c.get("outputs", [])
                 if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert views, "no widget view saved in any output"

"""The names this project installs belong to it alone: no top-level import name of ours is also provided by
another installed distribution, and nothing at the repository root shadows one of theirs.

Hugging Face's kernel hub (import name ``kernels``) is a transformers dependency since 5.25; a root folder
of that name once shadowed it whenever the root was on ``sys.path`` (``python -m pytest``,
``python -m minirunner``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUR_NAMES = {"minirunner", "simulators"}


def test_our_top_level_names_are_ours_alone() -> None:
    owners = importlib.metadata.packages_distributions()
    ours = {name for name, dists in owners.items() if "minirunner" in dists}
    assert ours == OUR_NAMES, f"minirunner installs the top-level names {sorted(ours)}"
    shared = {name: sorted(set(owners[name]) - {"minirunner"}) for name in ours}
    assert not any(shared.values()), f"also provided by another distribution: {shared}"


def test_no_root_folder_shadows_an_installed_distribution() -> None:
    owners = importlib.metadata.packages_distributions()
    for entry in ROOT.iterdir():
        is_package = (entry / "__init__.py").is_file()
        is_module = entry.suffix == ".py"
        name = entry.name if is_package else entry.stem if is_module else None
        if name is None or name in OUR_NAMES:
            continue
        others = sorted(set(owners.get(name, [])) - {"minirunner"})
        assert not others, f"{entry.name} at the repository root shadows {others}'s import name {name!r}"


@pytest.mark.skipif(importlib.util.find_spec("kernels") is None,
                    reason="Hugging Face's kernels not installed")
def test_kernels_from_the_root_is_hugging_faces() -> None:
    """From the repository root (on sys.path, as for ``python -m pytest``), ``import kernels`` is Hugging
    Face's distribution, and a transformers model class that pulls it in imports."""
    code = (
        "import importlib.metadata, pathlib, kernels, sys\n"
        "dist = importlib.metadata.distribution('kernels')\n"
        "files = {pathlib.Path(dist.locate_file(f)).resolve() for f in dist.files}\n"
        "assert pathlib.Path(kernels.__file__).resolve() in files, kernels.__file__\n"
        "from transformers import Qwen3ForCausalLM\n"
        "print('ok', Qwen3ForCausalLM.__name__)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "Qwen3ForCausalLM"]

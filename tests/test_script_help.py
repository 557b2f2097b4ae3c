"""`--help` of the shell scripts prints usage and starts nothing (a newcomer's first try)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path: Path) -> dict:
    return {"OUT": str(tmp_path / "report"), "PATH": "/usr/bin:/bin"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_gpu_check_help_prints_usage_and_runs_nothing(flag, tmp_path):
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), flag], capture_output=True,
                         text=True, timeout=30, env=_env(tmp_path))
    assert out.returncode == 0
    assert out.stdout.startswith("usage: scripts/gpu_check.sh") and "--dry-run" in out.stdout
    assert "gpu_check: report folder" not in out.stdout and not (tmp_path / "report").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_rejects_an_unknown_option(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--bogus"], capture_output=True,
                         text=True, timeout=30, env=_env(tmp_path))
    assert out.returncode == 2 and "unknown option" in out.stderr
    assert not (tmp_path / "report").exists()

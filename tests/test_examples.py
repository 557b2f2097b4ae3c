"""The examples in examples/ (written after vLLM's offline-inference examples, with the same calls a vLLM
user makes), run as a user runs them: each as __main__ in one fresh interpreter, on the embedded model."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RUNNER = """
import runpy, sys
for path in sys.argv[1:]:
    print(f"=== {path}", flush=True)
    sys.argv = [path]
    runpy.run_path(path, run_name="__main__")
"""
SCRIPTS = ["basic.py", "generate_defaults.py", "prefix_caching.py", "reproducibility.py",
           "reproducibility.py", "simple_profiling.py", "metrics.py"]


def test_the_vllm_style_examples_run_and_show_what_they_claim(tmp_path):
    proc = subprocess.run([sys.executable, "-c", RUNNER, *[str(EXAMPLES / s) for s in SCRIPTS]],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = proc.stdout.split("=== ")[1:]
    out = {}
    for name, part in zip(SCRIPTS, parts, strict=True):
        out.setdefault(name, []).append(part)
    for name in ("basic.py", "generate_defaults.py"):
        texts = re.findall(r"Generated text: (['\"])(.+)\1$", out[name][0], re.MULTILINE)
        assert len(texts) == 4, out[name][0]
    caching = out["prefix_caching.py"][0]
    assert "Generated answers are the same: True" in caching
    cached = [int(n) for n in re.findall(r"cached prompt tokens: (\d+)", caching)]
    assert len(cached) == 4 and min(cached) > 0
    first, second = out["reproducibility.py"]
    assert first.split("\n", 1)[1] == second.split("\n", 1)[1], "same seed, same texts and number"
    caller = int(re.search(r"after seeding itself with 0: (\d+)", first).group(1))
    assert caller == random.Random(0).randint(0, 100), "the engine moved the caller's random state"
    metrics = out["metrics.py"][0]  # four prompts: four requests finished, each after its first token
    finished = re.findall(r"vllm:request_success \(counter\) = (\d+)", metrics)
    assert sum(map(int, finished)) == 4, metrics
    assert re.search(r"time_to_first_token_seconds \(histogram\)\n    sum = [\d.]+\n    count = 4\n", metrics)
    traces = list((tmp_path / "vllm_profile").glob("*.json"))
    assert len(traces) == 1 and str(traces[0].name) in out["simple_profiling.py"][0]

"""The first run a newcomer makes: ``python -m minirunner generate "ROMEO."`` samples with the embedded
model's published defaults (not greedy, which loops on a model this small), prints its seed, and the same
seed gives the same text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from minirunner import LLM, SamplingParams
from minirunner.assets import default_model_dir
from minirunner.generation_config import sampling_defaults

REPO_ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "minirunner", "generate", *args, "ROMEO."], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _body_and_seed(stdout: str) -> tuple[str, int | None]:
    """(prompt + completion, the seed the summary line names): stdout is the text, a blank line, then
    the one-line "[... tok/s ...]" summary."""
    body, summary = stdout.rsplit("\n\n[", 1)
    m = re.search(r"seed (\d+) \(--seed \1 repeats it\)", summary)
    return body, int(m.group(1)) if m else None


def test_the_default_run_samples_and_its_printed_seed_repeats_it(tmp_path):
    first, seed = _body_and_seed(_cli(cwd=tmp_path).stdout)
    assert seed is not None, "the run must print the seed it sampled with"
    again, seed_again = _body_and_seed(_cli("--seed", str(seed), cwd=tmp_path).stdout)
    assert (again, seed_again) == (first, seed)


def test_temperature_zero_stays_greedy(tmp_path):
    body, seed = _body_and_seed(_cli("--temperature", "0", "--max-tokens", "24", cwd=tmp_path).stdout)
    greedy = LLM(num_threads=1).generate("ROMEO.", SamplingParams(temperature=0, max_tokens=24),
                                         use_tqdm=False)[0]
    assert seed is None and body == "ROMEO." + greedy.outputs[0].text


def _longest_line_run(text: str) -> int:
    """How often the most repeated non-empty line of ``text`` occurs."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return max(Counter(lines).values(), default=0)


def test_the_embedded_defaults_do_not_loop_where_greedy_does():
    defaults = sampling_defaults(default_model_dir())
    assert defaults.get("temperature", 1.0) > 0, "the embedded model's defaults must sample"
    llm = LLM(num_threads=1)
    greedy = llm.generate("ROMEO.", SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    assert _longest_line_run(greedy[0].outputs[0].text) >= 3  # the loop a newcomer used to see
    sampled = llm.generate(["ROMEO."] * 8, [SamplingParams(**defaults, max_tokens=64, seed=s)
                                           for s in range(8)], use_tqdm=False)
    texts = [o.outputs[0].text for o in sampled]
    assert len(set(texts)) == 8  # varied
    assert all(_longest_line_run(t) < 3 for t in texts), texts


def test_the_readme_shows_the_run_it_names(tmp_path):
    readme = (REPO_ROOT / "README.md").read_text()
    m = re.search(r'generate "ROMEO\." --seed (\d+)` prints exactly this.*?```text\n(.*?)```', readme, re.S)
    assert m, "the README's first-run example is missing"
    body, _ = _body_and_seed(_cli("--seed", m.group(1), cwd=tmp_path).stdout)
    assert body.rstrip() == m.group(2).rstrip()

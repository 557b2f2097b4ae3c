"""The on-disk compile cache (worker/compile_cache.py): the folder ``MINIRUNNER_COMPILE_CACHE`` names (or
the default under ~/.cache), torch pointed at it only inside the engine's scope, a second process that
reuses the first one's compiled step (torch's own cache counters report the hit), and a bad value refused
with a ValueError that names the variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_model

from minirunner.worker.compile_cache import ENV_VAR, cache_dir, configure_compile_cache, inductor_cache_dir

# One process: build a compiled engine over the tiny model, run one decode step, print torch's counters.
CHILD = """
import json, sys
import torch
torch.set_num_threads(1)
from torch._dynamo.utils import counters
from minirunner import LLM, SamplingParams
kw = dict(dtype="float32", device="cpu", attention_backend="torch", block_size=4, max_num_seqs=2,
          num_threads=1)
params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
llm = LLM(sys.argv[1], graph_mode="compile", cudagraph_capture_sizes=[1], **kw)
out = llm.generate([[5, 6, 7]], params, use_tqdm=False)
eager = LLM(sys.argv[1], graph_mode="none", **kw).generate([[5, 6, 7]], params, use_tqdm=False)
print(json.dumps(dict(tokens=out[0].outputs[0].token_ids, eager=eager[0].outputs[0].token_ids,
                      inductor=dict(counters["inductor"]), folder=str(llm.engine.runner.graphs.cache_dir))))
"""


def test_default_folder_is_under_the_home_cache_and_names_torch(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert cache_dir() == Path.home() / ".cache" / "minirunner" / "compile" / f"torch-{torch.__version__}"
    monkeypatch.setenv(ENV_VAR, "~/elsewhere")
    assert cache_dir() == Path.home() / "elsewhere"


def test_a_file_or_an_uncreatable_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "untouched"))
    a_file = tmp_path / "not_a_folder"
    a_file.write_text("x")
    monkeypatch.setenv(ENV_VAR, str(a_file))
    with pytest.raises(ValueError, match=f"{ENV_VAR}=.*is a file, not a folder"):
        configure_compile_cache()
    monkeypatch.setenv(ENV_VAR, str(a_file / "below"))
    with pytest.raises(ValueError, match=f"{ENV_VAR}=.*cannot be created"):
        configure_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "untouched")  # nothing was set


def test_configure_makes_the_folder_and_points_inductor_at_it_only_inside_the_scope(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "new" / "cache"))
    folder = configure_compile_cache()
    assert folder == (tmp_path / "new" / "cache").resolve() and folder.is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "before")  # the caller's, untouched
    with pytest.raises(KeyError), inductor_cache_dir(folder):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
        raise KeyError("the engine's work failed")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "before")  # put back, even then
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    with inductor_cache_dir(folder):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # unset before, unset after


def test_a_second_process_reuses_the_first_ones_compiled_step(tmp_path):
    """The second process runs the same architecture with other weights: it loads the first one's
    compiled step (a cache hit) and still gives its own model's eager tokens, since weights are inputs
    of the compiled code, never baked into it."""
    model, _ = make_tiny_model(tmp_path / "a", "llama_gqa", seed=0)
    other, _ = make_tiny_model(tmp_path / "b", "llama_gqa", seed=1)
    folder = tmp_path / "compile-cache"
    env = dict(os.environ, **{ENV_VAR: str(folder)})

    def run(path) -> dict:
        out = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run(model)
    files = {p for p in folder.rglob("*") if p.is_file()}
    assert first["folder"] == str(folder.resolve())
    assert files, "the first process left no compiled artefacts in the cache folder"
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert first["tokens"] == first["eager"]
    second = run(other)
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert second["tokens"] == second["eager"] and second["eager"] != first["eager"]

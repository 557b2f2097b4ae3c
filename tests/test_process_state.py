"""A library leaves the process alone (minirunner/engine_scope.py): building and running an ``LLM`` keeps
the caller's torch threads, random generators, garbage collector and environment as they were; each
engine's steps run with its own thread count; only the entry points freeze the start-up heap and
configure logging; environment variables are read in one module (minirunner/envs.py)."""

from __future__ import annotations

import gc
import logging
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.log import configure_logging

SRC = Path(__file__).resolve().parent.parent / "minirunner"
SAMPLED = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)


def _caller_state() -> dict:
    return dict(torch=torch.get_rng_state(), python=random.getstate(), numpy=np.random.get_state()[1].copy(),
                threads=torch.get_num_threads(), frozen=gc.get_freeze_count(), environ=dict(os.environ))


def _assert_unchanged(before: dict, after: dict) -> None:
    assert torch.equal(before["torch"], after["torch"]), "torch's global generator moved"
    assert before["python"] == after["python"], "Python's random state moved"
    assert np.array_equal(before["numpy"], after["numpy"]), "NumPy's random state moved"
    for key in ("threads", "environ"):
        assert before[key] == after[key], key
    # a freeze moves every live object into the permanent generation; a frozen object freed meanwhile
    # (after an entry point froze this process's heap earlier) only shrinks the count
    assert after["frozen"] <= before["frozen"], "frozen"


class _ThreadsInSteps:
    """torch's thread count seen inside each forward of a model (a module forward pre-hook, torch's public
    hook on every module), so a test reads what a step ran with, not what the engine says."""

    def __init__(self):
        self.seen: list[int] = []
        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self.hook)

    def hook(self, module, args):
        self.seen.append(torch.get_num_threads())

    def take(self) -> set[int]:
        seen, self.seen = set(self.seen), []
        return seen


def test_two_engines_keep_their_own_threads_and_the_callers_state(tmp_path):
    path, _ = make_tiny_model(tmp_path, "llama")
    kw = dict(device="cpu", block_size=4, max_num_seqs=2, num_kv_blocks=32, seed=7)
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(3)
    probe = _ThreadsInSteps()
    try:
        torch.manual_seed(123)
        random.seed(123)
        np.random.seed(123)
        before = _caller_state()
        one = LLM(str(path), num_threads=1, **kw)
        two = LLM(str(path), num_threads=2, **kw)
        _assert_unchanged(before, _caller_state())
        probe.take()
        for llm, threads in ((one, 1), (two, 2), (one, 1)):  # the second engine did not change the first
            llm.generate([[5, 6, 7], [9, 10]], SAMPLED, use_tqdm=False)
            assert probe.take() == {threads}
            _assert_unchanged(before, _caller_state())
        assert (one.engine.num_threads, two.engine.num_threads) == (1, 2)
    finally:
        probe.handle.remove()
        torch.set_num_threads(caller_threads)


def test_a_compiled_engine_leaves_the_environment_and_uses_its_cache_folder(tmp_path, monkeypatch):
    """``TORCHINDUCTOR_CACHE_DIR`` points at the engine's folder only while the engine works: the
    compiled step lands there, and the caller's environment is what it was, its own compile folder
    included. (The caller compiles first: torch itself writes two variables on any compile, the cache
    folder and a private handshake with the modules it loads; those are torch's, not the engine's.)"""
    path, _ = make_tiny_model(tmp_path, "llama")
    folder, callers = tmp_path / "compile-cache", tmp_path / "callers-inductor"
    monkeypatch.setenv("MINIRUNNER_COMPILE_CACHE", str(folder))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(callers))
    torch.compile(lambda x: x * 2 + 1)(torch.ones(3))  # the caller's own compile
    caller_threads = torch.get_num_threads()
    try:
        before = _caller_state()
        llm = LLM(str(path), device="cpu", block_size=4, max_num_seqs=1, num_kv_blocks=16, num_threads=1,
                  graph_mode="compile", cudagraph_capture_sizes=[1])
        out = llm.generate([[5, 6, 7]], SAMPLED, use_tqdm=False)
        _assert_unchanged(before, _caller_state())
    finally:
        torch.set_num_threads(caller_threads)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(callers)
    assert len(out[0].outputs[0].token_ids) == 6
    assert [t["graph"] for t in llm.get_step_trace()].count("compile") >= 1
    assert list((folder / "fxgraph").rglob("*")), "the compiled step was not cached in the engine's folder"


SCRIPT = """
import gc, sys, weakref
import torch, transformers  # noqa: F401  the heap a real program has before its first engine
from minirunner import LLM, SamplingParams
from minirunner.core.gc_heap import freeze_startup_heap
refs = []
for i in range(2):
    llm = LLM(sys.argv[1], device="cpu", num_threads=1, num_kv_blocks=32, block_size=4)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert gc.get_freeze_count() == 0, "building or running an LLM froze the heap"
    refs.append(weakref.ref(llm.engine))
    llm.close()
    del llm, out
gc.collect()
assert all(r() is None for r in refs), "an engine that was closed and dropped must be collectable"
freeze_startup_heap()  # what the entry points call (the CLI, the server): once per process
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen
freeze_startup_heap()
assert gc.get_freeze_count() == frozen
print("ok")
"""


def test_an_llm_freezes_nothing_and_the_entry_points_freeze_once(tmp_path):
    """In a fresh process, since a freeze is process-wide."""
    path, _ = make_tiny_model(tmp_path, "llama")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
    assert "leaked" not in done.stderr  # the heap is handed back at exit: no binding reports a leak


def test_a_fallback_from_the_fast_path_is_a_warning_the_cli_shows(tmp_path):
    """``minirunner generate --graph-mode compile`` where the C kernel cannot build (a compiler that
    fails): the run still works, and stderr says, once, that the fast path is off; ``--log-level error``
    hides it."""
    env = dict(os.environ, CC="false", MINIRUNNER_COMPILE_CACHE=str(tmp_path / "cache"))
    base = [sys.executable, "-m", "minirunner", "generate", "ROMEO.", "--max-tokens", "4", "--device", "cpu",
            "--graph-mode", "compile", "--cudagraph-capture-sizes", "1", "--max-num-seqs", "1",
            "--num-threads", "1", "--temperature", "0"]
    runs = [subprocess.run(base + extra, capture_output=True, text=True, timeout=900, env=env)
            for extra in ([], ["--log-level", "error"])]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.startswith("ROMEO.")
    said = r"^WARNING minirunner\.kernels\.paged_decode_cpu: .*CPU decode kernel is not used.*$"
    warning = re.findall(said, runs[0].stderr, re.MULTILINE)
    assert len(warning) == 1, runs[0].stderr[-3000:]
    assert "CPU decode kernel" not in runs[1].stderr


def test_configure_logging_adds_one_handler_and_sets_the_level():
    root = logging.getLogger("minirunner")
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("info")
        configure_logging("warning")
        added = [h for h in root.handlers if h not in handlers]
        assert len(added) == 1 and root.level == logging.WARNING
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _code_lines(pattern: str) -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(pattern, code):
                found.append(f"{path.relative_to(SRC.parent)}:{n}")
    return found


def test_environment_variables_are_read_in_one_module():
    readers = {p.split(":")[0] for p in _code_lines(r"\benviron\b|getenv\(")}
    assert readers == {"minirunner/envs.py"}


def test_no_library_code_seeds_the_callers_generators_or_freezes_the_heap():
    for place in _code_lines(r"torch\.manual_seed\(|torch\.random\.manual_seed|(np\.)?random\.seed\("):
        path, n = place.split(":")
        above = (SRC.parent / path).read_text().splitlines()[int(n) - 2]
        assert "fork_rng" in above, f"{place} seeds a generator the caller shares"
    assert _code_lines(r"gc\.freeze\(") == ["minirunner/core/gc_heap.py:" + _line_of("core/gc_heap.py",
                                                                                     "gc.freeze()")]
    callers = {p.split(":")[0] for p in _code_lines(r"freeze_startup_heap\(\)")}
    callers.discard("minirunner/core/gc_heap.py")
    assert callers == {"minirunner/cli.py", "minirunner/entrypoints/openai/cli_args.py",
                       "minirunner/tools/bench/__init__.py"}
    # torch's thread count: set around an engine's work (engine_scope.py), in a tensor-parallel worker
    # process (its own process), and around the bench's transformers baseline (restored after it)
    assert {p.split(":")[0] for p in _code_lines(r"set_num_threads\(")} == {
        "minirunner/engine_scope.py", "minirunner/distributed/shard_worker.py",
        "minirunner/tools/bench/run.py"}


def _line_of(relative: str, text: str) -> str:
    lines = (SRC / relative).read_text().splitlines()
    return str(next(n for n, line in enumerate(lines, 1) if text in line.split("#", 1)[0]))

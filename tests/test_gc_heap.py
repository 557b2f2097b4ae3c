"""The start-up heap is frozen once per process when the first engine is built (the collections a decode
loop triggers no longer walk torch's and transformers' objects), and engines stay collectable: one that
is closed and dropped is freed by the collector, however many are built. Run in a fresh process, since
the freeze is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, weakref
    import torch, transformers  # noqa: F401  the heap a real program has before its first engine
    from minirunner import LLM, SamplingParams
    assert gc.get_freeze_count() == 0
    refs = []
    for i in range(3):
        llm = LLM(device="cpu", num_threads=1, num_kv_blocks=64)
        if i == 0:
            frozen = gc.get_freeze_count()
            assert frozen > 10_000, frozen  # the imports' objects, frozen by the first engine
        out = llm.generate(["To be"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4
        refs.append(weakref.ref(llm.engine))
        llm.close()
        del llm, out
    assert gc.get_freeze_count() <= frozen  # once per process: later engines freeze nothing more
    gc.collect()
    assert all(r() is None for r in refs), "an engine that was closed and dropped must be collectable"
    print("ok")
""")


def test_the_first_engine_freezes_the_startup_heap_and_engines_stay_collectable():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
    assert "leaked" not in done.stderr  # the heap is handed back at exit: no binding reports a leak

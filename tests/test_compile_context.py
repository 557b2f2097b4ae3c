"""The context ladder of compiled steps (worker/graph_keys.py): a compiled step whose attention runs
over a padded width attends over the block-table columns its batch needs, rounded up to a rung (64
tokens' worth, then doubling), not over the whole table, and gives the tokens of eager steps (greedy),
also when a batch's context grows across a rung during the run. A decode step through the C kernel
(bounded by each row's length) is compiled once, at the full width.

torch.compile takes seconds per step on a small CPU: one compiled engine, a one-bucket ladder.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.worker.cudagraph import GraphKey, GraphKind
from minirunner.worker.graph_keys import context_columns, context_ladder, narrow_context

# block_size 4 and the tiny model's 128 positions: 32 block-table columns; rungs of 16 and 32 columns.
KW = dict(dtype="float32", device="cpu", attention_backend="torch", block_size=4, max_num_seqs=4,
          num_kv_blocks=128, num_threads=1)


def test_the_ladder_rule():
    assert context_ladder(16, 16) == [4, 8, 16]  # the embedded model: 256 positions, blocks of 16
    assert context_ladder(4, 32) == [16, 32]
    assert context_ladder(16, 3) == [3]  # a table narrower than the first rung is one rung
    assert [context_columns(n, 16, 16) for n in (1, 64, 65, 128, 129, 256)] == [4, 4, 8, 8, 16, 16]
    assert context_columns(None, 16, 16) == 16  # no length given: the full width
    assert context_columns(0, 4, 32) == 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("ctx"), "llama_gqa")
    return str(path)


def _greedy(llm, prompts, max_tokens):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _grow_past_a_rung(compiled, eager):
    """Three requests (padded to the bucket of 4): the longest starts at 52 tokens, within the first rung
    (64 tokens = 16 columns), and grows past it to 52 + 24 = 76 tokens (the second rung)."""
    prompts = [[(5 * i + j) % 90 + 3 for j in range(n)] for i, n in enumerate((12, 30, 52))]
    assert _greedy(compiled, prompts, 24) == _greedy(eager, prompts, 24)
    steps = [t for t in compiled.engine.trace if t.graph == "compile"]
    assert len(steps) >= 20  # the decode steps replayed compiled steps, not eager ones


def test_compiled_steps_attend_over_the_rung_the_batch_needs_and_match_eager(model_dir):
    # Where the C decode kernel is not built (no compiler), a compiled decode step attends through the
    # torch form over a padded width: the rung. Turned off here, before the first trace.
    compiled = LLM(model_dir, graph_mode="compile", cudagraph_capture_sizes=[4], **KW)
    compiled.engine.runner.graphs.backend.cpu_kernel = False
    eager = LLM(model_dir, graph_mode="none", **KW)
    _grow_past_a_rung(compiled, eager)
    graphs = compiled.engine.runner.graphs
    key = GraphKey(4, GraphKind.GREEDY)
    assert graphs.contexts() == [(key, 16), (key, 32)]
    assert graphs.keys() == [key]

    # A short batch compiles only the first rung: half the table's columns.
    short = LLM(model_dir, graph_mode="compile", cudagraph_capture_sizes=[4], **KW)
    short.engine.runner.graphs.backend.cpu_kernel = False
    prompts = [[(3 * i + j) % 90 + 3 for j in range(n)] for i, n in enumerate((5, 9))]
    assert _greedy(short, prompts, 10) == _greedy(eager, prompts, 10)
    assert short.engine.runner.graphs.contexts() == [(key, 16)]


def test_decode_through_the_c_kernel_compiles_one_step_per_key_at_full_width(model_dir):
    # The kernel reads each row up to its own length, so a rung would change nothing it computes: a
    # batch growing past a rung replays the one full-width step instead of compiling a second.
    compiled = LLM(model_dir, graph_mode="compile", cudagraph_capture_sizes=[4], **KW)
    graphs = compiled.engine.runner.graphs
    if not graphs.backend.cpu_kernel:
        pytest.skip("the C decode kernel does not build here (no C compiler)")
    _grow_past_a_rung(compiled, LLM(model_dir, graph_mode="none", **KW))
    key = GraphKey(4, GraphKind.GREEDY)
    assert graphs.contexts() == [(key, 32)]


def test_a_narrowed_context_is_a_view_of_the_static_buffers(model_dir):
    llm = LLM(model_dir, graph_mode="none", **KW)
    buffers = llm.engine.runner.buffers
    meta = buffers.static_meta(4)
    narrow = narrow_context(meta, 16)
    assert tuple(narrow.block_tables.shape) == (4, 16) and meta.block_tables.shape[1] == 32
    assert narrow.block_tables.data_ptr() == meta.block_tables.data_ptr()
    assert narrow.max_seq_len == 16 * 4
    buffers.block_tables[1, 3] = 7  # a write into the buffers is what the narrowed step reads
    assert int(narrow.block_tables[1, 3]) == 7 and int(narrow.block_tables_cpu[1, 3]) == 7
    assert narrow_context(meta, 32) is meta
    assert torch.equal(narrow.seq_lens, meta.seq_lens)

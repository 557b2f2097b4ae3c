"""graph_mode="compile" on the steps no bucket replays (prefills, chunked prefills, steps mixing prefill and
decode rows): the model's forward compiled once for every token count, each layer's attention an opaque
op on the step's own metadata. The tokens are those of eager steps, and a new prompt length compiles
nothing new.
"""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_model
from torch._dynamo.utils import counters

from minirunner import LLM, SamplingParams

KW = dict(dtype="float32", device="cpu", attention_backend="torch", block_size=4, max_num_seqs=4,
          max_num_batched_tokens=24)  # a 24-token budget: long prompts are chunked beside decode rows


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("compiled_forward"), "qwen3")
    return str(path)


@pytest.fixture(scope="module")
def engines(model_dir):
    return (LLM(model_dir, graph_mode="none", **KW),
            LLM(model_dir, graph_mode="compile", cudagraph_capture_sizes=[4], **KW))


def _prompts(lengths, seed):
    return [[(seed * 31 + 7 * i + 3 * j) % 90 + 3 for j in range(n)] for i, n in enumerate(lengths)]


def _eager_steps(llm, since):
    """Steps after ``since`` that no bucket took, on two tokens or more: the trace says "piecewise"."""
    steps = [t for t in llm.get_step_trace()[since:] if t["bucket_size"] is None and t["num_tokens"] >= 2]
    assert all(t["graph"] == "piecewise" for t in steps)
    return steps


def test_mixed_and_chunked_steps_run_compiled_with_eager_tokens(engines):
    eager, compiled = engines
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = _prompts([3, 30, 1, 11, 17], seed=1)  # a 30-token prompt takes two chunks; a 1-token one
    since = len(compiled.get_step_trace())
    got = [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    assert got == want
    steps = _eager_steps(compiled, since)
    assert any(t["num_prefill_tokens"] and t["num_decode_tokens"] for t in steps), "no mixed step ran"
    assert steps
    assert any(t["graph"] == "compile" for t in compiled.get_step_trace()[since:])  # decode: the bucket


def test_every_prompt_length_shares_one_compile(model_dir, engines):
    eager = engines[0]
    compiled = LLM(model_dir, graph_mode="compile", cudagraph_capture_sizes=[4], **KW)  # nothing traced yet
    params = SamplingParams(temperature=0.0, max_tokens=1)  # prefill steps only: no bucket runs
    graphs = counters["stats"]["unique_graphs"]
    for lengths in ([5, 9], [2, 7, 13], [23], [4, 4, 4, 4]):
        prompts = _prompts(lengths, seed=len(lengths))
        since = len(compiled.get_step_trace())
        got = [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)]
        assert got == [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
        assert _eager_steps(compiled, since)
    assert counters["stats"]["unique_graphs"] - graphs == 1, "the forward was traced again for another length"

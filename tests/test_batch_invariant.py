"""Batch-invariant mode (``batch_invariant=True``): a request's tokens and every logprob (sampled token,
top-k, prompt logprobs) are bit-identical whether it runs alone or among companions, under every
scheduling feature; decode logprobs equal the prompt logprobs of the same sequence (zero KL); the same
checks with the mode off find a difference (the negative control: the test can fail).

Real engines on a tiny fp32 model and the embedded one; floats compared with ``==``, never a tolerance.
"""

from __future__ import annotations

import logging
import random

import pytest
import test_equality_matrix as matrix
import torch
from test_equality_matrix import reference  # noqa: F401 (a fixture)
from test_oracle import PROMPTS, expected, models  # noqa: F401 (the oracle's fixture)
from test_spec_decode import pair  # noqa: F401 (a fixture)
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.model import batch_invariant

VOCAB = 96
MAX_LEN = 128  # the tiny model's max_position_embeddings


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp("bi"), "llama_gqa", seed=4)[0])


def _prompt(rng: random.Random, lo: int, hi: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(rng.randint(lo, hi))]


def _result(out) -> tuple:
    """Everything a user reads of one request: tokens and logprobs of every sample, prompt logprobs."""
    def floats(rows):
        return None if rows is None else [None if d is None else {t: lp.logprob for t, lp in d.items()}
                                          for d in rows]
    return ([(c.token_ids, floats(c.logprobs)) for c in out.outputs], floats(out.prompt_logprobs))


def _params(rng: random.Random, greedy: bool, n: int = 1, max_tokens: int = 12) -> SamplingParams:
    if greedy:
        return SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=3, prompt_logprobs=2,
                              ignore_eos=True, n=n)
    return SamplingParams(temperature=0.9, top_k=40, seed=rng.randrange(1 << 20), max_tokens=max_tokens,
                          logprobs=3, prompt_logprobs=2, ignore_eos=True, n=n)


def _in_batch(llm: LLM, target: list[int], params: SamplingParams, companions: list[list[int]],
              rng: random.Random):
    """The target's output when it runs at a random place among ``companions`` (each with its own
    greedy or seeded parameters)."""
    where = rng.randint(0, len(companions))
    prompts = companions[:where] + [target] + companions[where:]
    others = [_params(rng, rng.random() < 0.5, max_tokens=rng.randint(1, 14)) for _ in companions]
    plist = others[:where] + [params] + others[where:]
    return llm.generate(prompts, plist, use_tqdm=False)[where]


# Each case: engine options; the target runs alone in a roomy engine and among 0-40 companions here.
CASES = {
    "chunked-8": dict(max_num_batched_tokens=8),
    "chunked-29": dict(max_num_batched_tokens=29, max_num_seqs=5),
    "prefix-warm": dict(enable_prefix_caching=True, max_num_batched_tokens=40),
    "preempt": dict(block_size=4, num_kv_blocks=40, max_num_seqs=8),
    "max-seqs-3": dict(max_num_seqs=3),
    "async": dict(async_scheduling=True, max_num_batched_tokens=24),
    "compile": dict(graph_mode="compile", cudagraph_capture_sizes=[2, 4]),
}


def _property(path: str, options: dict, mode: bool, seeds, n: int = 1) -> list[tuple]:
    """For each seed: a random target (greedy or seeded) alone in a roomy engine, then among a random
    number of random companions in an engine with ``options``; the pairs of results."""
    alone_llm = LLM(path, device="cpu", batch_invariant=mode)
    llm = LLM(path, device="cpu", batch_invariant=mode, **options)
    pairs = []
    for seed in seeds:
        rng = random.Random(seed)
        target = _prompt(rng, 1, 60)
        params = _params(rng, greedy=seed % 2 == 0, n=n)
        alone = _result(alone_llm.generate([target], params, use_tqdm=False)[0])
        if options.get("enable_prefix_caching"):  # warm the cache with the target and a sibling
            llm.generate([target, target[:len(target) // 2] + [5]], params, use_tqdm=False)
        companions = [_prompt(rng, 1, 70) for _ in range(rng.randint(0, 40))]
        if options.get("enable_prefix_caching"):
            companions += [target[:rng.randint(1, len(target))] + _prompt(rng, 1, 10) for _ in range(3)]
        pairs.append((alone, _result(_in_batch(llm, target, params, companions, rng))))
    return pairs


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_request_is_bit_identical_alone_and_among_companions(tiny, case):
    for alone, batched in _property(tiny, CASES[case], True, seeds=range(3)):
        assert batched == alone


def test_n_greater_than_one_forks_are_bit_identical_alone_and_among_companions(tiny):
    for alone, batched in _property(tiny, dict(max_num_batched_tokens=16), True, seeds=range(3), n=3):
        assert batched == alone


def test_with_the_mode_off_the_same_property_finds_a_difference(tiny):
    """The negative control: without the mode, some target's logprobs change with its companions (so
    the property test above can fail)."""
    pairs = _property(tiny, dict(max_num_batched_tokens=29, max_num_seqs=5), False, seeds=range(4))
    assert any(alone != batched for alone, batched in pairs), \
        "nothing differed with the mode off: the property test would not notice a broken mode"


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculation_gives_the_plain_decode_tokens(pair, method):  # noqa: F811
    """Greedy speculation (verify steps of k + 1 rows) gives the tokens and prompt logprobs of the plain
    engine's target alone, among companions. (A request asking for sampled logprobs is not speculated,
    so the logprobs compared are the prompt's.)"""
    rng = random.Random(7)
    plain = LLM(pair["target"], device="cpu", batch_invariant=True)
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
              "prompt_lookup_max": 3} if method == "ngram" else \
        {"method": "draft_model", "model": pair["noisy"], "num_speculative_tokens": 3}
    spec = LLM(pair["target"], device="cpu", batch_invariant=True, max_num_batched_tokens=32,
               speculative_config=config)
    params = SamplingParams(temperature=0, max_tokens=16, prompt_logprobs=2, ignore_eos=True)
    for _ in range(3):
        phrase = _prompt(rng, 3, 6)
        target = phrase * 4 + _prompt(rng, 1, 5)  # repeats: the n-gram proposer finds drafts
        alone = _result(plain.generate([target], params, use_tqdm=False)[0])
        companions = [_prompt(rng, 1, 40) for _ in range(rng.randint(0, 12))]
        assert _result(_in_batch(spec, target, params, companions, rng)) == alone
    trace = spec.get_step_trace()
    assert sum(t["num_accepted_tokens"] for t in trace) > 0, "no draft accepted: speculation untested"


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
def test_zero_kl_decode_logprobs_equal_the_prompt_logprobs_of_the_same_sequence(tiny, greedy):
    """The logprobs a decode produced (sampled token and top 3) equal, bit for bit, the prompt logprobs
    of prompt + generated tokens scored as one prompt (teacher forcing), here among companions."""
    rng = random.Random(11)
    llm = LLM(tiny, device="cpu", batch_invariant=True, max_num_batched_tokens=24)
    for _ in range(3):
        prompt = _prompt(rng, 2, 30)
        params = _params(rng, greedy, max_tokens=20)
        companions = [_prompt(rng, 1, 40) for _ in range(rng.randint(0, 10))]
        sample = _in_batch(llm, prompt, params, companions, rng).outputs[0]
        score = SamplingParams(max_tokens=1, prompt_logprobs=3)
        scored = llm.generate([prompt + list(sample.token_ids)], score, use_tqdm=False)[0].prompt_logprobs
        for i, (token, decoded) in enumerate(zip(sample.token_ids, sample.logprobs, strict=True)):
            teacher = scored[len(prompt) + i]
            assert decoded[token].logprob == teacher[token].logprob
            assert {t: lp.logprob for t, lp in decoded.items()} == \
                {t: lp.logprob for t, lp in teacher.items()}


def test_tensor_parallel_two_ranks_is_deterministic_and_batch_invariant(tiny):
    """TP = 2 under the mode (all-reduces summed in rank order): a target alone and among companions
    gives the same bits, and a second engine repeats them. (TP = 1 and TP = 2 may differ.)"""
    rng = random.Random(5)
    target, params = _prompt(rng, 5, 40), _params(rng, greedy=False)
    companions = [_prompt(rng, 1, 50) for _ in range(9)]
    results = []
    for _ in range(2):
        with LLM(tiny, device="cpu", batch_invariant=True, tensor_parallel_size=2,
                 max_num_batched_tokens=24) as llm:
            alone = _result(llm.generate([target], params, use_tqdm=False)[0])
            assert _result(_in_batch(llm, target, params, companions, random.Random(1))) == alone
            results.append(alone)
    assert results[0] == results[1]


def test_the_embedded_model_is_bit_identical_alone_and_among_companions():
    """The embedded model (vocabulary 1024, 4 layers): a greedy target among 12 companions."""
    rng = random.Random(3)
    target = [rng.randrange(3, 1000) for _ in range(37)]
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=5, ignore_eos=True)
    llm = LLM(device="cpu", batch_invariant=True, max_num_batched_tokens=64)
    alone = _result(llm.generate([target], params, use_tqdm=False)[0])
    companions = [[rng.randrange(3, 1000) for _ in range(rng.randint(1, 80))] for _ in range(12)]
    assert _result(_in_batch(llm, target, params, companions, rng)) == alone


@pytest.mark.parametrize("async_scheduling, proposer", [(False, "none"), (True, "ngram"),
                                                        (False, "draft_model")])
def test_the_equality_matrix_holds_with_the_mode_on(pair, reference, async_scheduling, proposer):  # noqa: F811
    """A subset of the equality matrix (tests/test_equality_matrix.py) with the mode on: chunked prefill,
    prefix caching and preemption by a tiny pool give the plain eager engine's greedy tokens."""
    llm = matrix._engine(pair, "none", async_scheduling, proposer, batch_invariant=True)
    outputs = matrix._run(llm, matrix._prompts(matrix.PROMPTS), matrix.GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    trace = llm.get_step_trace()
    assert sum(t["num_preempted"] for t in trace) > 0, "the tiny pool was meant to preempt"
    assert sum(o.metrics.num_cached_prompt_tokens for o in outputs) > 0, "no prefix-cache hit"


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2", "qwen3", "llama3_rope", "mistral"])
def test_the_oracle_holds_with_the_mode_on(models, name):  # noqa: F811
    """transformers' greedy tokens, with the mode on, chunked (a budget of 10 tokens)."""
    llm = LLM(str(models[name][0]), device="cpu", batch_invariant=True, max_num_batched_tokens=10)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)]
    assert got == expected(models, name, PROMPTS)


def test_the_mode_is_logged_once_at_start_with_what_it_changes(tiny, caplog):
    with caplog.at_level(logging.INFO, logger="minirunner"):
        LLM(tiny, device="cpu", batch_invariant=True)
    said = [r.getMessage() for r in caplog.records if "batch-invariant mode" in r.getMessage()]
    assert len(said) == 1 and "attention" in said[0] and "lm_head" in said[0]


@pytest.mark.parametrize("options, match", [
    (dict(dtype="bfloat16"), "float32"),
    (dict(attention_backend="triton"), "attention_backend"),
    (dict(batch_invariant="yes"), "True or False"),
])
def test_what_the_mode_cannot_honour_is_refused_with_what_to_do(tiny, options, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny, device="cpu", **{"batch_invariant": True, **options})


def test_the_linear_probe_sees_the_default_kernels_rows_change_with_the_batch():
    """What the mode replaces: F.linear's rows change with the row count here, the mode's do not."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(768, 256, generator=gen), torch.randn(64, 256, generator=gen)
    full = torch.nn.functional.linear(x, w)
    assert any(not torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]) for m in (1, 2, 3, 5))
    packed = batch_invariant.cpu_linear.pack(w)
    assert batch_invariant.check_rows(packed, 256, 768)


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve"], ["bench"]])
def test_the_cli_flag_reaches_the_engine_config(command):
    """``--batch-invariant`` on generate, serve and bench becomes LLM(batch_invariant=True); absent, off."""
    from minirunner.cli import _llm_kwargs, build_parser

    parser = build_parser()
    assert _llm_kwargs(parser.parse_args([*command, "--batch-invariant"]))["batch_invariant"] is True
    assert _llm_kwargs(parser.parse_args(command))["batch_invariant"] is False


def test_generate_with_the_flag_logs_the_mode_and_is_greedy_equal_to_the_api():
    """A real ``minirunner generate --batch-invariant`` process says what the mode changes (INFO) and
    prints the greedy text the API gives with the mode on."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "minirunner", "generate", "To be", "--batch-invariant", "--temperature",
           "0", "--max-tokens", "8", "--device", "cpu", "--log-level", "info"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    assert "batch-invariant mode" in proc.stderr
    text = LLM(device="cpu", batch_invariant=True).generate(
        ["To be"], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0].text
    assert text.strip() and text.strip() in proc.stdout

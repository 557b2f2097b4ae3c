"""Metamorphic test of the engine: seeded random workloads (greedy and seeded sampling, shared prefixes,
n > 1, stop ids, logprobs, prompt logprobs, bias, min_tokens, penalties) served by a roomy reference
engine and by engines whose configuration must not change any output (block size, a pool small enough
to preempt, a short token budget, one seat, prefix caching, one generate call per prompt, a contiguous
layout, speculation, compiled graph steps). Token ids, finish reasons and logprobs must agree; a
generate that does not return within a generous deadline (a livelock) fails.

The CI slice runs a few workloads per configuration; the long mode (marked ``slow``, skipped unless
``--run-slow``) runs 200 per configuration, or N with ``MINIRUNNER_METAMORPHIC_SEEDS=N``:
``python -m pytest -p no:nbval -o addopts="" --run-slow -m slow tests/test_metamorphic.py``.
"""

from __future__ import annotations

import os
import random

import pytest
from test_load_regressions import deadline
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams

VOCAB = 96
MAX_MODEL_LEN = 64
REFERENCE = dict(block_size=16, num_kv_blocks=64, max_num_seqs=8)
# name -> (engine arguments, which requests it serves: "all", "n1" (no n > 1), "greedy")
VARIANTS = {
    "block_size_1": (dict(block_size=1, num_kv_blocks=1024), "all"),
    "tiny_pool_preempts": (dict(block_size=4, num_kv_blocks=11, max_num_seqs=4), "all"),
    "short_token_budget": (dict(block_size=4, num_kv_blocks=40, max_num_batched_tokens=7), "all"),
    "one_seat": (dict(block_size=16, num_kv_blocks=8, max_num_seqs=1), "all"),
    "prefix_caching_under_pressure": (dict(block_size=4, num_kv_blocks=12, max_num_seqs=3,
                                           max_num_batched_tokens=9, enable_prefix_caching=True), "all"),
    "one_call_per_prompt": (dict(REFERENCE, enable_prefix_caching=True), "all"),
    "contiguous": (dict(block_size=4, num_kv_blocks=64, kv_layout="contiguous"), "n1"),
    "ngram_speculation": (dict(block_size=4, num_kv_blocks=14, max_num_seqs=4, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 2}), "greedy"),
    "draft_speculation": (dict(block_size=4, num_kv_blocks=14, max_num_seqs=4,
                               enable_prefix_caching=True), "greedy"),
    "compiled_graphs": (dict(block_size=4, num_kv_blocks=16, max_num_seqs=4, graph_mode="compile",
                             cudagraph_capture_sizes=[4]), "all"),
}
SLOW_ONLY = {"compiled_graphs"}  # torch.compile takes seconds per bucket on a CPU
CI_SEEDS = 2
LONG_SEEDS = int(os.environ.get("MINIRUNNER_METAMORPHIC_SEEDS", "200"))


def workload(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """1..5 requests; prompts of 1..24 tokens, some sharing a prefix; mixed sampling parameters."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(2)] + [[]]
    items = []
    for _ in range(rng.randint(1, 5)):
        prompt = rng.choice(prefixes) + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))]
        greedy = rng.random() < 0.4
        max_tokens = rng.randint(1, 16)
        kw = dict(n=1 if rng.random() < 0.6 else rng.randint(2, 3), max_tokens=max_tokens,
                  seed=rng.randrange(1 << 31), ignore_eos=rng.random() < 0.5,
                  temperature=0.0 if greedy else rng.choice([0.6, 1.0, 1.5]))
        if not greedy:
            kw.update(top_k=rng.choice([-1, 5, 30]), top_p=rng.choice([1.0, 0.9]))
        if rng.random() < 0.3:
            kw["stop_token_ids"] = [rng.randrange(3, VOCAB) for _ in range(3)]
        if rng.random() < 0.3:
            kw["logprobs"] = rng.randint(0, 3)
        if rng.random() < 0.15:
            kw["prompt_logprobs"] = rng.randint(0, 2)
        if rng.random() < 0.15:
            kw["logit_bias"] = {rng.randrange(VOCAB): rng.choice([-100.0, 4.0])}
        if rng.random() < 0.15:
            kw["min_tokens"] = rng.randint(1, max_tokens)
        if rng.random() < 0.15:
            kw.update(presence_penalty=0.5, repetition_penalty=1.2)
        items.append((prompt, SamplingParams(**kw)))
    return items


def served(items, kind: str) -> list[int]:
    """Indices of the workload's requests a variant serves (outputs never depend on other requests)."""
    keep = {"all": lambda p: True, "n1": lambda p: p.n == 1, "greedy": lambda p: p.temperature == 0}[kind]
    return [i for i, (_, p) in enumerate(items) if keep(p)]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("metamorphic")
    target_dir, model = make_tiny_model(root, "llama_gqa", seed=3, vocab_size=VOCAB)
    model.save_pretrained(root / "draft", safe_serialization=True)
    return dict(target=str(target_dir), draft=str(root / "draft"))


@pytest.fixture(scope="module")
def engines(dirs):
    """Engines built once per module, by name (the prefix cache carries over between workloads,
    which must not change outputs either)."""
    built = {}

    def get(name: str) -> LLM:
        if name not in built:
            kw = dict(REFERENCE) if name == "reference" else dict(VARIANTS[name][0])
            if name == "draft_speculation":
                kw["speculative_config"] = {"method": "draft_model", "model": dirs["draft"],
                                            "num_speculative_tokens": 3}
            built[name] = LLM(dirs["target"], dtype="float32", device="cpu", attention_backend="torch",
                              num_threads=1, max_model_len=MAX_MODEL_LEN, **kw)
        return built[name]
    return get


def run(llm: LLM, items, one_call_per_prompt: bool = False) -> list:
    if not items:
        return []
    with deadline(60):
        if one_call_per_prompt:
            return [llm.generate([p], sp, use_tqdm=False)[0] for p, sp in items]
        return llm.generate([p for p, _ in items], [sp for _, sp in items], use_tqdm=False)


def same_logprobs(got, want, what: str) -> None:
    assert (got is None) == (want is None), what
    if got is None:
        return
    assert len(got) == len(want), what
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None), what
        if g is None:
            continue
        assert set(g) == set(w), what
        for token, lp in w.items():
            assert g[token].rank == lp.rank, what
            assert g[token].logprob == pytest.approx(lp.logprob, abs=1e-4), what


def check_agree(seed: int, name: str, engines) -> None:
    items = workload(seed)
    settings, kind = VARIANTS[name]
    keep = served(items, kind)
    want = run(engines("reference"), items)
    got = run(engines(name), [items[i] for i in keep], one_call_per_prompt=name == "one_call_per_prompt")
    for i, g in zip(keep, got, strict=True):
        w, what = want[i], f"seed {seed}, {name}, request {i} ({items[i][1]})"
        assert len(g.outputs) == len(w.outputs), what
        same_logprobs(g.prompt_logprobs, w.prompt_logprobs, what + ": prompt logprobs")
        for gc, wc in zip(g.outputs, w.outputs, strict=True):
            assert gc.token_ids == wc.token_ids, what
            assert (gc.finish_reason, gc.stop_reason) == (wc.finish_reason, wc.stop_reason), what
            same_logprobs(gc.logprobs, wc.logprobs, what + ": logprobs")
            if wc.cumulative_logprob is not None:
                assert gc.cumulative_logprob == pytest.approx(wc.cumulative_logprob, abs=1e-3), what
    engines(name).engine.kv.check_invariants()
    assert not engines(name).engine.has_unfinished_requests()


@pytest.mark.parametrize("name", [name for name in VARIANTS if name not in SLOW_ONLY])
def test_configurations_agree_on_seeded_workloads(engines, name):
    offset = list(VARIANTS).index(name) * 1000  # each configuration sees its own workloads
    for seed in range(offset, offset + CI_SEEDS):
        check_agree(seed, name, engines)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_configurations_agree_on_many_seeded_workloads(engines, name):
    for seed in range(LONG_SEEDS):
        check_agree(100_000 + seed, name, engines)

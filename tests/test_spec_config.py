"""Speculative config validation (clear ValueErrors), n-gram prompt lookup, and the formulas of
minirunner.spec_decode.math against a Monte Carlo simulation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_model

from minirunner import LLM
from minirunner.assets import default_draft_dir, default_model_dir
from minirunner.config import ModelConfig
from minirunner.spec_decode.config import SpeculativeConfig
from minirunner.spec_decode.math import (
    best_k,
    expected_tokens_per_step,
    monte_carlo_tokens_per_step,
    walltime_factor,
)
from minirunner.spec_decode.ngram import ngram_propose

TARGET = default_model_dir()
TARGET_CONFIG = ModelConfig.from_dir(TARGET)


def _parse(**spec):
    return SpeculativeConfig.from_dict(spec, TARGET, TARGET_CONFIG, 256)


@pytest.mark.parametrize("spec,message", [
    (dict(method="draft_model", num_speculative_tokens=0), "num_speculative_tokens must be"),
    (dict(method="ngram", num_speculative_tokens=-1), "num_speculative_tokens must be"),
    (dict(method="eagle", num_speculative_tokens=2), "method 'eagle' is not supported"),
    (dict(method="ngram", num_speculative_tokens=2, prompt_lookup_min=4, prompt_lookup_max=2),
     "must not exceed"),
    (dict(method="ngram", num_speculative_tokens=2, typo=1), "unknown keys"),
    (dict(method="ngram", num_speculative_tokens=2,
          num_speculative_tokens_per_batch_size=[[1, 4, 3]]), "must be in \\[0"),
    (dict(method="ngram", num_speculative_tokens=2,
          num_speculative_tokens_per_batch_size=[[1, 4, 2], [4, 8, 1]]), "overlap"),
    (dict(method="ngram", num_speculative_tokens=2, dynamic_k="magic"), "dynamic_k"),
])
def test_bad_settings_are_refused_with_a_clear_error(spec, message):
    with pytest.raises(ValueError, match=message):
        _parse(**spec)


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    draft, _ = make_tiny_model(tmp_path, "qwen3", vocab_size=96)
    with pytest.raises(ValueError, match="vocabulary \\(96 tokens\\) differs from the target's \\(1024\\)"):
        _parse(method="draft_model", model=str(draft), num_speculative_tokens=2)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(device="cpu", speculative_config={"method": "draft_model", "model": str(draft),
                                              "num_speculative_tokens": 2})


def test_a_foreign_target_needs_a_draft(tmp_path):
    target, _ = make_tiny_model(tmp_path, "llama")
    with pytest.raises(ValueError, match="needs 'model'"):
        SpeculativeConfig.from_dict({"method": "draft_model", "num_speculative_tokens": 2}, target,
                                    ModelConfig.from_dir(target))


def test_defaults_and_the_batch_size_table():
    cfg = _parse(method="draft_model", num_speculative_tokens=4,
                 num_speculative_tokens_per_batch_size=[[9, 64, 0], [1, 2, 4], [3, 8, 2]])
    assert cfg.model == str(default_draft_dir())
    assert [cfg.k_for_batch_size(b) for b in (1, 2, 3, 8, 9, 64, 65)] == [4, 4, 2, 2, 0, 0, 4]
    ngram = _parse(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4)
    assert (ngram.prompt_lookup_min, ngram.prompt_lookup_max) == (4, 4)


def test_ngram_lookup_finds_the_longest_most_recent_match():
    seq = [1, 2, 3, 4, 9, 9, 1, 2, 3, 5, 6, 7, 2, 3]
    # the 2-gram [2, 3] last appeared at index 7, followed by 5, 6, 7
    assert ngram_propose(seq, 3, 1, 2) == [5, 6, 7]
    # a longer window prefers the 3-gram match [1, 2, 3] ... only if the suffix is [1, 2, 3]
    assert ngram_propose(seq + [1, 2, 3], 2, 1, 3) == [5, 6]
    assert ngram_propose([1, 2, 3], 2, 1, 3) == []  # no earlier occurrence of the suffix
    assert ngram_propose([4, 4, 4], 5, 1, 1) == [4]  # never runs past the sequence


def _ngram_brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The lookup by its definition: every window, longest n first, the most recent one."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = tokens[L - n:]
        starts = [w for w in range(L - n) if tokens[w:w + n] == suffix]
        if starts:
            return tokens[starts[-1] + n:starts[-1] + n + k]
    return []


def test_ngram_lookup_equals_its_definition_on_random_sequences():
    rng = np.random.default_rng(0)
    for _ in range(400):
        vocab = int(rng.integers(2, 8))  # small vocabularies: many overlapping matches
        seq = rng.integers(0, vocab, size=int(rng.integers(1, 60))).tolist()
        min_n = int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 4))
        k = int(rng.integers(1, 7))
        assert ngram_propose(seq, k, min_n, max_n) == _ngram_brute_force(seq, k, min_n, max_n), \
            (seq, k, min_n, max_n)


@pytest.mark.parametrize("alpha,k", [(0.0, 3), (0.5, 1), (0.77, 4), (0.9, 7), (1.0, 3)])
def test_expected_tokens_match_a_monte_carlo_run(alpha, k):
    sim = monte_carlo_tokens_per_step(alpha, k, 200_000, seed=1)
    assert abs(sim - expected_tokens_per_step(alpha, k)) < 0.02


def test_walltime_and_best_k():
    assert walltime_factor(0.8, 0, 0.3) == 1.0  # no speculation, no change
    assert best_k(0.1, 0.5) == 0  # drafts that fail and cost half a target step never pay
    k = best_k(0.8, 0.05)
    assert walltime_factor(0.8, k, 0.05) >= max(walltime_factor(0.8, j, 0.05) for j in range(17))
    # Leviathan et al.: if alpha > c some k gives at least (1 + alpha) / (1 + c)
    assert walltime_factor(0.6, best_k(0.6, 0.3), 0.3) >= (1 + 0.6) / (1 + 0.3) - 1e-12
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(1.5, 2)


def test_the_notebook_exercise_agrees_with_the_runner_formula():
    from simulators.speculative import make_exercise

    for seed in range(20):
        ex = make_exercise(seed)
        alpha = float(ex.question.split("a = ")[1].split(",")[0])
        k = int(ex.question.split("k = ")[1].split(" ")[0])
        assert abs(ex.solution() - expected_tokens_per_step(alpha, k)) < 1e-4
        assert ex.check(ex.solution()).correct
        assert not ex.check(None).correct and "not answered yet" in str(ex.check(None))
        assert not ex.check(ex.solution() - 1).correct


def test_one_kv_budget_pays_for_the_target_and_the_draft_cache():
    budget = 4 << 20
    llm = LLM(device="cpu", kv_cache_memory_bytes=budget,
              speculative_config={"method": "draft_model", "num_speculative_tokens": 2})
    target = TARGET_CONFIG.kv_bytes_per_token(torch.float32)
    draft = ModelConfig.from_dir(default_draft_dir()).kv_bytes_per_token(torch.float32)
    # both caches carry the runner's null block too, inside the same budget
    assert llm.engine.num_kv_blocks == budget // ((target + draft) * 16) - 1
    # the draft's KV layers hold as many blocks as the target's: one block id indexes both
    draft_caches = llm.engine.runner.drafter.kv_caches
    assert [c.shape[0] for c in draft_caches] == [llm.engine.num_kv_blocks + 1] * len(draft_caches)
    assert all(c.shape[0] == llm.engine.num_kv_blocks + 1 for c in llm.engine.runner.kv_caches)

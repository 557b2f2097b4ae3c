"""``minirunner bench``: the workloads are seeded and within their ranges, and a tiny run through the
command line writes a report whose figures are complete and consistent."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tiny_models import make_tiny_model

from minirunner.tools.bench.workloads import DISTRIBUTIONS, PAPER_MAX_LEN, make_workload


def test_workloads_are_seeded_and_fit():
    a = make_workload("nano", 50, 96, 128, seed=4, input_len=(8, 20), output_len=(3, 9))
    b = make_workload("nano", 50, 96, 128, seed=4, input_len=(8, 20), output_len=(3, 9))
    c = make_workload("nano", 50, 96, 128, seed=5, input_len=(8, 20), output_len=(3, 9))
    assert a.prompts == b.prompts and a.max_tokens == b.max_tokens and a.prompts != c.prompts
    assert all(8 <= len(p) <= 20 for p in a.prompts) and all(3 <= m <= 9 for m in a.max_tokens)
    assert all(3 <= t < 96 for p in a.prompts for t in p)
    fixed = make_workload("fixed", 3, 96, 128, input_len=(7, 7), output_len=(5, 5))
    assert [len(p) for p in fixed.prompts] == [7] * 3 and fixed.max_tokens == [5] * 3
    for name in ("sharegpt", "alpaca"):
        w = make_workload(name, 400, 96, 64, seed=1)
        assert all(len(p) + m <= 64 and m >= 1 for p, m in zip(w.prompts, w.max_tokens, strict=True))


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
def test_paper_means_scale_with_max_model_len(name):
    """Unclipped (a long max_model_len), the mean lengths are the paper's scaled by max_model_len / 2048."""
    w = make_workload(name, 20_000, 96, 16 * PAPER_MAX_LEN, seed=0)
    d = DISTRIBUTIONS[name]
    assert np.mean([len(p) for p in w.prompts]) == pytest.approx(16 * d["prompt_mean"], rel=0.05)
    assert np.mean(w.max_tokens) == pytest.approx(16 * d["output_mean"], rel=0.05)


def test_unknown_workload():
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("lmsys", 4, 96, 64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("bench"), "qwen3")
    return str(path)


def test_bench_cli_report(model_dir, tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = subprocess.run(
        [sys.executable, "-m", "minirunner", "bench", "--model", model_dir, "--device", "cpu",
         "--workload", "nano", "--num-requests", "12", "--input-len", "4", "20", "--output-len", "2",
         "12", "--block-size", "4", "--num-kv-blocks", "48", "--max-model-len", "64", "--compare",
         "transformers", "--compare", "contiguous", "--hf-batch-size", "4", "--json", str(out),
         "--plot", str(png), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "output tok/s" in proc.stdout and "minirunner vs" in proc.stdout
    report = json.loads(out.read_text())
    assert png.stat().st_size > 1000
    assert report["warmup"] == "short"
    wl = report["workload"]
    assert wl["num_requests"] == 12
    paged, hf, contiguous = report["results"]
    assert [r["engine"] for r in report["results"]] == ["minirunner", "transformers", "minirunner"]
    for r in (paged, hf, contiguous):
        assert r["output_tokens"] == wl["output_tokens"]  # useful tokens only, every one generated
        assert r["output_tok_per_s"] > 0 and r["total_tok_per_s"] > r["output_tok_per_s"]
        assert 0 < r["ttft_p50"] <= r["ttft_p99"] and 0 < r["tpot_p50"] <= r["tpot_p99"]
        assert r["peak_concurrent_seqs"] >= 1
    for r in (paged, contiguous):
        assert 0 < r["kv_utilization_min"] <= r["kv_utilization_mean"] <= 1
        assert r["num_preemptions"] >= 0 and r["cached_prompt_tokens"] == 0
        assert r["settings"]["num_kv_blocks"] == 48
        assert len(r["timeline"]["t"]) == len(r["timeline"]["kv_utilization"]) > 1
        assert sum(r["timeline"]["output_tokens"]) == wl["output_tokens"]
    # 48 blocks of 4 slots hold three 64-token reservations; paged fits far more at once
    assert contiguous["peak_concurrent_seqs"] == 3 < paged["peak_concurrent_seqs"]
    assert contiguous["kv_utilization_mean"] < paged["kv_utilization_mean"]
    assert hf["peak_concurrent_seqs"] == 4
    ratio = report["ratios"]["minirunner (contiguous)"]
    assert ratio["peak_concurrent_seqs"] == pytest.approx(paged["peak_concurrent_seqs"] / 3)


def test_text_workloads_encode_the_passages_and_need_a_tokenizer():
    from minirunner import LLM
    from minirunner.tools.bench.workloads import REPETITIVE_PROMPTS

    tok = LLM().get_tokenizer()
    w = make_workload("repetitive", 6, 1024, 256, output_len=(20, 20), tokenizer=tok)
    assert w.prompts[0] == list(tok.encode(REPETITIVE_PROMPTS[0])) and w.prompts[4] == w.prompts[0]
    assert w.max_tokens == [20] * 6
    with pytest.raises(ValueError, match="tokenizer"):
        make_workload("text", 2, 1024, 256)


def test_bench_speculative_side_by_side():
    """A speculative run beside plain decoding, transformers generate and transformers' assisted
    generation (its n-gram prompt lookup), on the embedded model and the repetitive text workload."""
    from minirunner.tools.bench import format_table, run_bench

    report = run_bench(workload="repetitive", num_requests=2, output_len=(16, 16), max_num_seqs=1,
                       device="cpu", hf_batch_size=1, warmup="workload",
                       speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                       compare=["plain", "transformers", "transformers_assisted"])
    assert report["warmup"] == "workload"
    spec, plain, hf, assisted = report["results"]
    assert [r["label"].split(" (")[0] for r in report["results"]] == [
        "minirunner", "minirunner", "transformers generate", "transformers assisted generate"]
    for r in report["results"]:
        assert r["output_tokens"] == 32 and r["output_tok_per_s"] > 0
        assert r["peak_concurrent_seqs"] == 1
    s = spec["speculative"]
    assert s["num_draft_tokens"] > 0 and 0 <= s["alpha"] <= 1 and 1 <= s["mean_accepted_length"] <= 3
    assert plain["speculative"] is None and plain["settings"]["speculative_config"] is None
    assert assisted["settings"]["prompt_lookup_num_tokens"] == 2
    assert set(report["ratios"]) == {plain["label"], hf["label"], assisted["label"]}
    ratio = report["ratios"][plain["label"]]["output_tok_per_s"]
    assert ratio == pytest.approx(spec["output_tok_per_s"] / plain["output_tok_per_s"])
    speedup = report["transformers_assisted_speedup"]["output_tok_per_s"]
    assert speedup == pytest.approx(assisted["output_tok_per_s"] / hf["output_tok_per_s"])
    assert "acceptance alpha" in format_table(report)


def test_bench_refuses_an_unknown_warmup():
    from minirunner.tools.bench import run_bench

    with pytest.raises(ValueError, match="warmup"):
        run_bench(num_requests=1, warmup="long")


def test_bench_plain_compare_needs_a_speculative_run():
    proc = subprocess.run([sys.executable, "-m", "minirunner", "bench", "--compare", "plain",
                           "--num-requests", "1", "--no-progress"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--speculative-config" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "minirunner", "bench", "--speculative-config", "{k: 3}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr

"""`minirunner bench serve` as `vllm bench serve` is used: a local ShareGPT-format file and the random
dataset, the completions and chat endpoints, gamma arrivals, chosen percentiles and goodput, against a live
server; its result JSON has `vllm bench serve`'s keys for the same metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("httpx")
pytest.importorskip("aiohttp")
from serve_helpers import ROOT, Server  # noqa: E402

from minirunner import LLM  # noqa: E402

# vllm/benchmarks/serve.py's result keys (its `benchmark` result dict and the top-level keys `main` adds),
# for --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
    "queue_times", "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p50",
                                                                               "p99")),
}
CONVERSATIONS = [("ROMEO:\nBut soft, what light through yonder window breaks?", "It is the east."),
                 ("KING HENRY:\nOnce more unto the breach, dear friends,", "Or close the wall up."),
                 ("HAMLET:\nTo be, or not to be, that is the question:", "Whether 'tis nobler in the mind"),
                 ("hi", "too short a prompt: skipped")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    template = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    s = Server("--chat-template", str(template))
    yield s
    s.stop()


def _bench(server, tmp_path, *args) -> tuple[dict, str]:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "minirunner", "bench", "serve", "--base-url", server.url,
                           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                           "--save-result", "--result-dir", str(tmp_path), "--result-filename", out.name,
                           "--disable-tqdm", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_sharegpt_file_on_the_chat_endpoint(server, tmp_path):
    data = tmp_path / "sharegpt.json"
    turns = [[{"from": "human", "value": q}, {"from": "gpt", "value": a}] for q, a in CONVERSATIONS]
    data.write_text(json.dumps([{"conversations": t} for t in turns]))
    result, stdout = _bench(server, tmp_path, "--dataset-name", "sharegpt", "--dataset-path", str(data),
                            "--num-prompts", "6", "--endpoint", "/v1/chat/completions",
                            "--request-rate", "30", "--burstiness", "0.5", "--ignore-eos",
                            "--goodput", "ttft:60000", "tpot:60000")
    assert set(result) == VLLM_KEYS
    assert (result["completed"], result["failed"], result["endpoint_type"]) == (6, 0, "openai-chat")
    tok = LLM(num_threads=1).get_tokenizer()
    want = {len(tok.encode(a)) for _, a in CONVERSATIONS[:3]}
    assert set(result["output_lens"]) <= want  # ignore_eos: each asked the reply's length, and got it
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])  # SLOs of a minute
    assert "Serving Benchmark Result" in stdout and "P99 TTFT (ms):" in stdout


def test_random_dataset_on_completions(server, tmp_path):
    result, _ = _bench(server, tmp_path, "--dataset-name", "random", "--random-input-len", "24",
                       "--random-output-len", "8", "--num-prompts", "5", "--ignore-eos", "--seed", "2")
    assert set(result) == VLLM_KEYS and result["request_goodput"] is None
    assert result["output_lens"] == [8] * 5 and result["total_output_tokens"] == 40
    assert all(0 < t <= e for t, e in zip(result["ttfts"], result["latencies"], strict=True))
    assert result["output_throughput"] == pytest.approx(40 / result["duration"])

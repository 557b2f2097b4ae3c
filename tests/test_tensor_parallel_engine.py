"""``LLM(tensor_parallel_size=2)`` end to end on CPU over gloo, with real worker processes.

On tiny fp32 Llama (GQA, tied embeddings), Qwen2 (q/k/v bias), Qwen3 (q/k norm, a vocabulary of 97 that
does not split evenly) and an MQA Llama (one KV head, replicated on both ranks), ``generate`` with a tiny
KV pool (preemption), a small token budget (chunked prefill) and prefix caching (shared prompt prefixes)
gives the greedy tokens of one device, and logprobs and prompt logprobs within 1e-5; seeded sampling
gives the same tokens, n = 2 included (rank 0 samples with the one-device sampler; a fork's block copy
runs on every rank). Head counts that do not split, and
the options tensor parallelism does not support, raise ValueError naming the argument before any
process starts. A killed worker makes the next ``generate`` raise within seconds; ``with`` / ``close()``
and ``del`` leave no worker process (while another tensor-parallel LLM of the module's fixture is open in
the same process: each has its own process group); Ctrl-C in the middle of ``generate`` raises
KeyboardInterrupt in the driver and leaves no worker once the script ends. The CLI and ``minirunner
bench`` take the flag.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_tensor_parallel import _gone, alive, make_mqa
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.distributed import WorkerError

NAMES = ["llama_gqa", "qwen2", "qwen3", "llama_mqa"]
# A tiny pool (two long requests need 2 x 14 blocks of 4), a small token budget, prefix caching on.
TIGHT = dict(device="cpu", attention_backend="torch", block_size=4, num_kv_blocks=20, max_num_seqs=2,
             max_num_batched_tokens=16, enable_prefix_caching=True, num_threads=1)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3)


def _prompts(vocab: int) -> list[list[int]]:
    """Six prompts of 19 to 39 tokens (a partial last block), pairs sharing a 12-token prefix (3 full
    blocks)."""
    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    prefixes = [rand(12) for _ in range(3)]
    return [prefixes[i // 2] + rand(7 + 4 * i) for i in range(6)]


def _model(root, name):
    if name == "llama_mqa":
        return make_mqa(root), 96
    vocab = 97 if name == "qwen3" else 96
    return make_tiny_model(root, name, vocab_size=vocab)[0], vocab


@pytest.fixture(scope="module", params=NAMES)
def engines(request, tmp_path_factory):
    """(one-device LLM, two-rank LLM, vocab) for one tiny model, shared by this module's tests."""
    path, vocab = _model(tmp_path_factory.mktemp("tp_engine"), request.param)
    one = LLM(path, **TIGHT)
    two = LLM(path, tensor_parallel_size=2, **TIGHT)
    yield one, two, vocab
    two.close()


def _close(a, b, what):
    assert a.keys() == b.keys(), what
    for token in a:
        assert abs(a[token].logprob - b[token].logprob) <= 1e-5, (what, token)


def test_generate_matches_one_device(engines):
    one, two, vocab = engines
    prompts = _prompts(vocab)
    params = [GREEDY if i % 2 else SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                           logprobs=3, prompt_logprobs=2)
              for i in range(len(prompts))]
    ref = one.generate(prompts, params, use_tqdm=False)
    got = two.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    for r, g in zip(ref, got, strict=True):
        for step, (a, b) in enumerate(zip(r.outputs[0].logprobs, g.outputs[0].logprobs, strict=True)):
            _close(a, b, f"logprobs step {step}")
        if r.prompt_logprobs is not None:
            for pos, (a, b) in enumerate(zip(r.prompt_logprobs[1:], g.prompt_logprobs[1:], strict=True)):
                _close(a, b, f"prompt logprobs position {pos + 1}")
    trace = two.get_step_trace()
    assert sum(o.metrics.num_preemptions for o in got) > 0, "the tiny pool was meant to preempt"
    assert any(t["num_prefill_tokens"] == TIGHT["max_num_batched_tokens"] for t in trace), "no chunk"
    assert sum(o.metrics.num_cached_prompt_tokens for o in got) > 0, "no prefix-cache hit"


def test_seeded_sampling_matches_one_device(engines):
    one, two, vocab = engines
    params = [SamplingParams(temperature=0.9, top_k=20, seed=7 + i, max_tokens=10, ignore_eos=True,
                             n=2 if i == 0 else 1)  # n = 2: a fork, its partial block copied on each rank
              for i in range(6)]
    ref = one.generate(_prompts(vocab), params, use_tqdm=False)
    got = two.generate(_prompts(vocab), params, use_tqdm=False)
    tokens = lambda outs: [[c.token_ids for c in o.outputs] for o in outs]  # noqa: E731
    assert tokens(got) == tokens(ref)
    assert len(got[0].outputs) == 2 and got[0].outputs[0].token_ids != got[0].outputs[1].token_ids


def test_sizes_and_options_it_cannot_run_raise_before_starting(tmp_path):
    path = make_tiny_model(tmp_path, "qwen2")[0]  # 4 attention heads, 2 KV heads
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide the model's 4 attention"):
        LLM(path, device="cpu", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
        LLM(path, device="cpu", tensor_parallel_size=0)
    for option, value in [("graph_mode", "compile"),
                          ("speculative_config", {"method": "ngram", "num_speculative_tokens": 2})]:
        with pytest.raises(ValueError, match=f"{option}=.* is not supported with tensor_parallel_size=2"):
            LLM(path, device="cpu", tensor_parallel_size=2, **{option: value})


def _tiny_llm(tmp_path) -> LLM:
    return LLM(make_tiny_model(tmp_path, "llama_gqa")[0], tensor_parallel_size=2, **TIGHT)


def test_a_killed_worker_makes_generate_raise_within_seconds(tmp_path):
    llm = _tiny_llm(tmp_path)
    prompts = _prompts(96)
    assert len(llm.generate(prompts, GREEDY, use_tqdm=False)) == len(prompts)
    (pid,) = llm.llm_engine.runner.worker_pids()
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=f"rank 1 \\(pid {pid}\\) died"):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert time.monotonic() - start < 10
    assert not llm.llm_engine.has_unfinished_requests()  # the failed call left the engine clean
    with pytest.raises(RuntimeError, match="closed or failed earlier"):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert _gone([pid])


def test_close_and_del_leave_no_worker(tmp_path):
    with _tiny_llm(tmp_path) as llm:
        pids = llm.llm_engine.runner.worker_pids()
        assert pids and all(alive(p) for p in pids)
        llm.generate(_prompts(96)[:2], GREEDY, use_tqdm=False)
    assert _gone(pids, within_s=0.0)  # close() joined them
    with pytest.raises(RuntimeError, match="closed or failed earlier"):
        llm.generate(_prompts(96)[:2], GREEDY, use_tqdm=False)
    llm = _tiny_llm(tmp_path / "again")
    pids = llm.llm_engine.runner.worker_pids()
    del llm
    gc.collect()
    assert _gone(pids, within_s=5.0)


def test_cli_generate_and_bench_take_tensor_parallel_size(tmp_path, capsys):
    from minirunner.cli import main

    path = make_tiny_model(tmp_path, "llama_gqa")[0]
    add_tokenizer(path)
    texts = {}
    for n in (1, 2):
        args = ["generate", "the quick brown fox", "--model", str(path), "--device", "cpu",
                "--max-tokens", "10", "--temperature", "0", "--tensor-parallel-size", str(n)]
        assert main(args) == 0
        texts[n] = capsys.readouterr().out
    assert texts[2].split("\n[")[0] == texts[1].split("\n[")[0]  # the same completion
    assert "tensor_parallel_size 2" in texts[2]
    assert main(["bench", "--model", str(path), "--compare", "one_device"]) == 2
    assert "--tensor-parallel-size" in capsys.readouterr().err


def test_ctrl_c_during_generate_leaves_no_worker(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while ``generate`` runs: the workers
    ignore it, the driver raises KeyboardInterrupt and the script goes on; when it ends, no worker is left."""
    path = make_tiny_model(tmp_path, "llama_gqa")[0]
    driver = ("import signal\n"
              # Python's own Ctrl-C handler, as under a terminal: a shell that starts the tests in the
              # background (no job control) hands its children SIGINT ignored
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from minirunner import LLM, SamplingParams\n"
              f"llm = LLM({str(path)!r}, tensor_parallel_size=2, device='cpu', num_threads=1)\n"
              "print('ready', *llm.llm_engine.runner.worker_pids(), flush=True)\n"
              "try:\n"
              "    while True:\n"
              "        llm.generate([[5] * 8] * 4, SamplingParams(max_tokens=100, ignore_eos=True),\n"
              "                     use_tqdm=False)\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted', flush=True)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    try:
        ready = proc.stdout.readline().split()
        assert ready[:1] == ["ready"], proc.stderr.read()
        time.sleep(1.0)  # in the middle of generating
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stdout.readline().strip() == "interrupted", proc.stderr.read()
        assert proc.wait(timeout=30) == 0
        assert _gone([int(p) for p in ready[1:]], within_s=5.0)
    finally:
        if proc.poll() is None:
            proc.kill()

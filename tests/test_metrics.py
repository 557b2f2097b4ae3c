"""LLM.get_metrics(): vLLM's metric records (vllm.v1.metrics.reader's shape, vLLM's names and meanings),
checked against what a user can count independently: the tokenizer's prompt lengths, the outputs, the step
trace, the speculative-decoding stats, and consistency while another thread reads mid-run."""

from __future__ import annotations

import threading

import pytest
from tiny_models import add_tokenizer, make_tiny_model
from transformers import AutoTokenizer

from minirunner import LLM, SamplingParams
from minirunner.metrics.reader import Counter, Gauge, Histogram, Vector

CPU = dict(dtype="float32", device="cpu", attention_backend="torch")
# vLLM's time-to-first-token buckets (vllm/v1/metrics/loggers.py), as Prometheus writes the `le` label
VLLM_TTFT_LE = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75",
                "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0",
                "+Inf"]
PROMPTS = ["the quick brown fox", "a stitch in time saves nine.", "to be or not to be, that is"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("metrics"), "llama_gqa")
    add_tokenizer(path)
    return path


def by_name(metrics, name, **labels):
    found = [m for m in metrics if m.name == name and labels.items() <= m.labels.items()]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def value(metrics, name, **labels):
    return by_name(metrics, name, **labels).value


def test_tokens_requests_and_latencies_match_what_was_generated(model_dir):
    llm = LLM(str(model_dir), **CPU)
    lengths = [5, 9, 3]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    m = llm.get_metrics()
    assert m == llm.engine.get_metrics()  # one set of metrics, read by both
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert value(m, "vllm:prompt_tokens") == sum(len(tok(p)["input_ids"]) for p in PROMPTS)
    assert value(m, "vllm:generation_tokens") == sum(lengths)
    assert value(m, "vllm:request_success", finished_reason="length") == 3
    assert value(m, "vllm:request_success", finished_reason="stop") == 0
    ttft = by_name(m, "vllm:time_to_first_token_seconds")
    assert isinstance(ttft, Histogram) and ttft.count == 3
    assert list(ttft.buckets) == VLLM_TTFT_LE and ttft.buckets["+Inf"] == 3
    assert list(ttft.buckets.values()) == sorted(ttft.buckets.values())  # cumulative
    assert ttft.sum == pytest.approx(sum(o.metrics.time_to_first_token for o in outs))
    # one inter-token latency per output token after the first (one token per step without speculation)
    assert by_name(m, "vllm:inter_token_latency_seconds").count == sum(n - 1 for n in lengths)
    e2e = by_name(m, "vllm:e2e_request_latency_seconds")
    assert e2e.count == 3 and e2e.sum == pytest.approx(sum(o.metrics.e2e_latency for o in outs))
    # after the run: nothing running or waiting, every block free (no prefix cache keeps any)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert isinstance(by_name(m, name), Gauge) and value(m, name) == 0
    for metric in m:
        assert metric.labels["engine"] == "0" and metric.labels["model_name"] == str(model_dir)
        assert metric.documentation
    names = {metric.name for metric in m}
    assert not any(n.endswith("_total") for n in names)
    assert not any(n.startswith("vllm:spec_decode") for n in names)  # only with speculation, as vLLM's
    # counters only grow: a second run adds to them
    llm.generate(PROMPTS[:1], params[0], use_tqdm=False)
    assert value(llm.get_metrics(), "vllm:generation_tokens") == sum(lengths) + lengths[0]


def test_preemptions_match_the_step_trace(model_dir):
    llm = LLM(str(model_dir), num_kv_blocks=6, block_size=4, max_model_len=24, max_num_batched_tokens=8,
              **CPU)
    prompts = [[3] * 10, [4] * 7, [5] * 12]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    preempted = sum(t["num_preempted"] for t in llm.get_step_trace())
    assert preempted > 0
    m = llm.get_metrics()
    assert value(m, "vllm:num_preemptions") == preempted
    # a preempted request recomputes its prompt: still counted once, when its first token came
    assert value(m, "vllm:prompt_tokens") == sum(map(len, prompts))


def test_usage_gauges_while_requests_run(model_dir):
    llm = LLM(str(model_dir), num_kv_blocks=32, block_size=4, max_num_seqs=2, **CPU)
    engine = llm.llm_engine
    for p in ([3] * 9, [4] * 5, [5] * 6):
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()
    m = llm.get_metrics()
    assert value(m, "vllm:num_requests_running") == 2  # max_num_seqs
    assert value(m, "vllm:num_requests_waiting") == 1
    # blocks for 9 + 1 and 5 + 1 tokens at 4 per block: 3 + 2 of 32
    assert value(m, "vllm:kv_cache_usage_perc") == pytest.approx(5 / 32)


def test_prefix_cache_queries_and_hits_count_tokens(model_dir):
    llm = LLM(str(model_dir), enable_prefix_caching=True, block_size=4, **CPU)
    prompt = list(range(3, 30))  # 27 tokens
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    llm.generate([prompt], params, use_tqdm=False)
    m = llm.get_metrics()
    assert (value(m, "vllm:prefix_cache_queries"), value(m, "vllm:prefix_cache_hits")) == (27, 0)
    llm.generate([prompt + [40, 41]], params, use_tqdm=False)
    m = llm.get_metrics()
    # the second prompt (29 tokens) finds the first one's 6 full blocks (24 tokens) in the cache
    assert (value(m, "vllm:prefix_cache_queries"), value(m, "vllm:prefix_cache_hits")) == (27 + 29, 24)


def test_an_aborted_request_counts_as_abort(model_dir):
    llm = LLM(str(model_dir), **CPU)
    for n, _chunk in enumerate(llm.stream(PROMPTS[:1], SamplingParams(max_tokens=20, ignore_eos=True))):
        if n == 2:
            break
    m = llm.get_metrics()
    assert value(m, "vllm:request_success", finished_reason="abort") == 1
    assert value(m, "vllm:num_requests_running") == 0


def test_spec_decode_counters_agree_with_the_spec_stats(model_dir):
    k = 3
    llm = LLM(str(model_dir), speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                                  "prompt_lookup_min": 1, "prompt_lookup_max": 3}, **CPU)
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 7]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)
    m = llm.get_metrics()
    stats = llm.get_spec_metrics()
    assert stats["num_draft_tokens"] > 0
    assert value(m, "vllm:spec_decode_num_drafts") == stats["num_steps"]
    assert value(m, "vllm:spec_decode_num_draft_tokens") == stats["num_draft_tokens"]
    accepted = value(m, "vllm:spec_decode_num_accepted_tokens")
    assert accepted == stats["num_accepted_tokens"]
    per_pos = by_name(m, "vllm:spec_decode_num_accepted_tokens_per_pos")
    assert isinstance(per_pos, Vector) and len(per_pos.values) == k
    assert sum(per_pos.values) == accepted  # a draft at position j is accepted only after 0..j-1
    assert per_pos.values == sorted(per_pos.values, reverse=True)
    assert value(m, "vllm:generation_tokens") == sum(len(o.outputs[0].token_ids) for o in outs)


def test_a_reader_thread_sees_consistent_snapshots(model_dir):
    llm = LLM(str(model_dir), **CPU)
    snapshots, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            snapshots.append(llm.get_metrics())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        llm.generate(PROMPTS * 3, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                     use_tqdm=False)
    finally:
        stop.set()
        reader.join()
    snapshots.append(llm.get_metrics())
    previous = {}
    for snap in snapshots:
        for metric in snap:
            if isinstance(metric, Histogram):
                counts = list(metric.buckets.values())
                assert counts == sorted(counts) and counts[-1] == metric.count
            if isinstance(metric, Counter):
                key = (metric.name, tuple(sorted(metric.labels.items())))
                assert metric.value >= previous.get(key, 0)
                previous[key] = metric.value
        # one step's update lands whole: without speculation every generated token is either a
        # request's first (a TTFT) or follows its previous one (an inter-token latency)
        assert value(snap, "vllm:generation_tokens") == \
            by_name(snap, "vllm:time_to_first_token_seconds").count \
            + by_name(snap, "vllm:inter_token_latency_seconds").count
    assert value(snapshots[-1], "vllm:request_success", finished_reason="length") == 9

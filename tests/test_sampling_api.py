"""vLLM's SamplingParams semantics against transformers: repetition_penalty greedy tokens equal
``generate(repetition_penalty=...)``; logprobs and prompt logprobs equal ``log_softmax`` of transformers'
logits (fp32, 1e-4); presence / frequency penalties follow OpenAI's formula over transformers' logits;
min_tokens, min_p and logit_bias do what they say; per-request values work batched."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.worker.logits_processing import LogitsBatch, apply_logits_processors

PROMPTS = [[5, 17, 33, 8, 61], [40, 9, 11, 3, 3, 3, 70, 22, 5, 6, 7, 81, 12], [90, 4]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    built = {}
    for name in ("llama", "qwen2", "qwen3", "llama_gqa"):
        path, model = make_tiny_model(root, name)
        built[name] = (path, model, LLM(str(path), dtype="float32", device="cpu",
                                        attention_backend="torch", block_size=4,
                                        max_num_batched_tokens=64))
    return built


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_matches_transformers(models, name, penalty):
    _, model, llm = models[name]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                            repetition_penalty=penalty)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                             repetition_penalty=penalty, eos_token_id=None, pad_token_id=0)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()
    plain = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                         use_tqdm=False)
    assert [o.outputs[0].token_ids for o in plain] != [o.outputs[0].token_ids for o in outs], \
        "the penalty should change some greedy output"


def test_presence_and_frequency_penalties_follow_openai(models):
    _, model, llm = models["llama_gqa"]
    presence, frequency = 0.7, 0.4
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                            presence_penalty=presence, frequency_penalty=frequency)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params, use_tqdm=False), strict=True):
        tokens, generated = list(prompt), []
        for _ in range(12):
            logits = _hf_logits(model, tokens)[-1]
            counts = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=96).float()
            logits = logits - frequency * counts - presence * (counts > 0).float()
            generated.append(int(logits.argmax()))
            tokens.append(generated[-1])
        assert out.outputs[0].token_ids == generated


def test_logprobs_match_transformers_log_softmax(models):
    _, model, llm = models["qwen3"]
    k = 5
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=10, ignore_eos=True, logprobs=k,
                            prompt_logprobs=3, repetition_penalty=1.2, top_k=30)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        c = out.outputs[0]
        ref = torch.log_softmax(_hf_logits(model, prompt + c.token_ids), dim=-1)
        assert len(c.logprobs) == len(c.token_ids)
        cumulative = 0.0
        for i, (token, entry) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            row = ref[len(prompt) - 1 + i]  # raw logits: before penalties, temperature, top-k
            assert abs(entry[token].logprob - row[token].item()) < 1e-4
            assert entry[token].rank == int((row > row[token]).sum()) + 1
            top = row.topk(k)
            for rank, (tid, lp) in enumerate(zip(top.indices.tolist(), top.values.tolist(), strict=True), 1):
                assert abs(entry[tid].logprob - lp) < 1e-4 and entry[tid].rank == rank
            assert len(entry) in (k, k + 1)
            cumulative += row[token].item()
        assert math.isclose(c.cumulative_logprob, cumulative, abs_tol=1e-3)
        plp = out.prompt_logprobs
        assert len(plp) == len(prompt) and plp[0] is None
        for pos in range(1, len(prompt)):
            row = ref[pos - 1]
            assert abs(plp[pos][prompt[pos]].logprob - row[prompt[pos]].item()) < 1e-4
            top = row.topk(3)
            assert all(abs(plp[pos][t].logprob - v) < 1e-4
                       for t, v in zip(top.indices.tolist(), top.values.tolist(), strict=True))


def test_prompt_logprobs_across_prefill_chunks_and_prefix_cache(models):
    path, model, _ = models["llama"]
    llm = LLM(str(path), dtype="float32", device="cpu", attention_backend="torch", block_size=4,
              max_num_batched_tokens=5, enable_prefix_caching=True)
    prompt = PROMPTS[1]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    out = llm.generate([prompt], params, use_tqdm=False)[0]  # cache is warm, yet every position
    ref = torch.log_softmax(_hf_logits(model, prompt), dim=-1)
    assert len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        assert abs(out.prompt_logprobs[pos][prompt[pos]].logprob - ref[pos - 1, prompt[pos]]) < 1e-4


def test_min_tokens_holds_eos_off(models):
    _, _, llm = models["llama"]
    # logit_bias makes EOS (2) the greedy choice at every step; min_tokens holds it off.
    params = SamplingParams(temperature=0, max_tokens=20, logit_bias={2: 100.0}, min_tokens=6)
    out = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 7 and 2 not in out.token_ids[:6] and out.token_ids[6] == 2
    assert out.finish_reason == "stop" and out.stop_reason is None
    early = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20,
                                                      logit_bias={2: 100.0}), use_tqdm=False)
    assert early[0].outputs[0].token_ids == [2]


def test_min_p_one_is_greedy_and_logit_bias_forces_a_token(models):
    _, _, llm = models["qwen2"]
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                          use_tqdm=False)
    hot = llm.generate(PROMPTS, SamplingParams(temperature=1.5, seed=3, min_p=1.0, max_tokens=8,
                                               ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in hot] == [o.outputs[0].token_ids for o in greedy]
    forced = llm.generate(PROMPTS, SamplingParams(temperature=1.0, seed=1, max_tokens=5,
                                                  ignore_eos=True, logit_bias={42: 100.0}),
                          use_tqdm=False)
    assert all(o.outputs[0].token_ids == [42] * 5 for o in forced)


def test_per_request_values_batched_equal_alone(models):
    _, _, llm = models["llama_gqa"]
    params = [
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5),
        SamplingParams(temperature=0.8, seed=4, max_tokens=10, ignore_eos=True, min_p=0.2,
                       frequency_penalty=1.0, logprobs=2),
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, presence_penalty=-1.0,
                       logit_bias={7: 3.0}),
    ]
    together = llm.generate(PROMPTS, params, use_tqdm=False)
    for i in range(3):
        alone = llm.generate([PROMPTS[i]], params[i], use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == together[i].outputs[0].token_ids
    # finished requests travel to the worker in the next step's data (SchedulerOutput.finished_req_ids,
    # as in vLLM): after one more step, none of them keeps a row
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    assert llm.engine.runner.sampler.logits_processors.penalties.rows == {}, "finished requests keep rows"


@pytest.mark.parametrize("kwargs, words", [
    (dict(n=0), "n must"),
    (dict(logprobs=-1), "logprobs"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(logit_bias={3: 200.0}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(stop_token_ids=[-4]), "stop_token_ids"),
])
def test_bad_new_parameters(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_unknown_token_ids_are_refused_at_admission(models):
    _, _, llm = models["llama"]
    with pytest.raises(ValueError, match="vocabulary"):
        llm.engine.add_request([5, 6], SamplingParams(logit_bias={96: 1.0}))
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.engine.add_request([5, 6], SamplingParams(stop_token_ids=[500]))
    with pytest.raises(ValueError, match="tokenizer"):  # this directory has none
        llm.engine.add_request([5, 6], SamplingParams(stop=["x"]))
    assert not llm.engine.requests


def test_logits_processors_trace_as_one_graph():
    """No host sync and no data-dependent shape: dynamo traces the whole function without a break
    (what a captured step needs), and the traced version computes the same logits."""
    g = torch.Generator().manual_seed(0)
    n, vocab = 3, 50
    logits = torch.randn(n, vocab, generator=g)
    counts = torch.randint(0, 3, (n, vocab), generator=g, dtype=torch.int32)
    batch = LogitsBatch(
        bias=torch.zeros(n, vocab).index_fill_(1, torch.tensor([4]), float("-inf")),
        counts=counts, prompt_mask=torch.rand(n, vocab, generator=g) < 0.2,
        repetition=torch.tensor([1.0, 1.3, 0.7]), frequency=torch.tensor([0.0, 0.5, -0.5]),
        presence=torch.tensor([0.2, 0.0, 1.0]), min_p=torch.tensor([0.0, 0.1, 0.5]),
        temperature=torch.tensor([1.0, 0.0, 0.7]))
    torch._dynamo.reset()
    traced = torch.compile(apply_logits_processors, backend="eager", fullgraph=True)
    torch.testing.assert_close(traced(logits, batch), apply_logits_processors(logits, batch))
    out = apply_logits_processors(logits, batch)
    assert torch.isinf(out[:, 4]).all()
    # min_p 0.5 at temperature 0.7 keeps exactly the tokens with p_T >= 0.5 * max p_T.
    before = apply_logits_processors(logits, dataclasses.replace(batch, min_p=None, temperature=None))
    p = torch.softmax(before[2] / 0.7, dim=-1)
    assert torch.equal(~torch.isinf(out[2]), p >= 0.5 * p.max())
    assert torch.equal(out[1], before[1]), "greedy rows are left to argmax"

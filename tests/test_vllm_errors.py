"""Bad input raises ValueError whose message contains vLLM's own phrase (vllm/sampling_params.py and its
input processor), so ``pytest.raises(match=...)`` and log greps written for vLLM keep working; and every
non-finite float in SamplingParams is refused, naming the field."""

from __future__ import annotations

import math
import re

import pytest
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams

# (arguments, the phrase vLLM's message holds for them)
VLLM_PHRASES = [
    (dict(n=0), "n must be at least 1, got 0"),
    (dict(n=1.5), "n must be an int, but is of type"),
    (dict(presence_penalty=2.5), "presence_penalty must be in [-2, 2], got 2.5"),
    (dict(frequency_penalty=-3.0), "frequency_penalty must be in [-2, 2], got -3.0"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be greater than zero, got 0.0"),
    (dict(repetition_penalty=math.inf), "repetition_penalty must be a finite number, got inf"),
    (dict(temperature=math.nan), "temperature must be a finite number, got nan"),
    (dict(temperature=-0.5), "temperature must be non-negative, got -0.5"),
    (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    (dict(top_k=-2), "top_k must be 0 (disable), or at least 1, got -2"),
    (dict(top_k=1.5), "top_k must be an integer, got float"),
    (dict(min_p=1.5), "min_p must be in [0, 1], got 1.5"),
    (dict(max_tokens=0), "max_tokens must be at least 1, got 0"),
    (dict(min_tokens=-1), "min_tokens must be greater than or equal to 0, got -1"),
    (dict(min_tokens=5, max_tokens=3), "min_tokens must be less than or equal to max_tokens=3, got 5"),
    (dict(logprobs=-2), "logprobs must be non-negative or -1, got -2"),
    (dict(prompt_logprobs=-2), "prompt_logprobs must be non-negative or -1, got -2"),
    (dict(stop_token_ids=[1, "x"]), "stop_token_ids must contain only integers, got [1, 'x']"),
    (dict(stop=["a", ""]), "stop cannot contain an empty string"),
    (dict(stop=["a"], detokenize=False), "stop strings are only supported when detokenize is True"),
    (dict(bad_words=["a", ""]), "bad_words cannot contain an empty string"),
    (dict(allowed_token_ids=[]), "allowed_token_ids is not None and empty!"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens must be an integer >= 1 or -1, got 0"),
    (dict(logit_bias={"x": 1.0}), "logit_bias contains key(s) that cannot be converted to integer token IDs"),
]


@pytest.mark.parametrize("kwargs, phrase", VLLM_PHRASES, ids=[p for _, p in VLLM_PHRASES])
def test_sampling_params_errors_hold_vllms_phrase(kwargs, phrase):
    with pytest.raises(ValueError, match=re.escape(phrase)):
        SamplingParams(**kwargs)


FLOAT_FIELDS = ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_non_finite_floats_are_refused_naming_the_field(name, value):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        SamplingParams(**{name: value})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_logit_bias_is_refused(value):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={3: value})


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("errors"), "llama_gqa")  # vocabulary of 96
    add_tokenizer(path)
    return LLM(str(path), dtype="float32", device="cpu", attention_backend="torch", max_model_len=64)


@pytest.mark.parametrize("prompt, params, phrase", [
    ([], SamplingParams(), "Prompt cannot be empty"),
    ({"prompt_token_ids": []}, SamplingParams(), "Prompt cannot be empty"),
    ([5, 96, 7], SamplingParams(), "Token id 96 is out of vocabulary"),
    ([5] * 80, SamplingParams(),
     "The decoder prompt (length 80) is longer than the maximum model length of 64"),
    ([5, 6], SamplingParams(logprobs=30),
     "Requested sample logprobs of 30, which is greater than max allowed: 20"),
    ([5, 6], SamplingParams(prompt_logprobs=30),
     "Requested prompt logprobs of 30, which is greater than max allowed: 20"),
    ([5, 6], SamplingParams(allowed_token_ids=[3, 200]), "allowed_token_ids contains out-of-vocab token id!"),
    ([5, 6], SamplingParams(logit_bias={300: 1.0}), "in logit_bias contain out-of-vocab token ids"),
])
def test_admission_errors_hold_vllms_phrase(llm, prompt, params, phrase):
    with pytest.raises(ValueError, match=re.escape(phrase)) as err:
        llm.generate([prompt], params, use_tqdm=False)
    assert "prompt 0" in str(err.value)  # minirunner's own wording stays: which prompt, and what to do
    with pytest.raises(ValueError, match=re.escape(phrase)):
        llm.llm_engine.add_request(prompt, params)
    assert not llm.llm_engine.has_unfinished_requests()

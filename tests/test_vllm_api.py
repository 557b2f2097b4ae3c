"""Scripts written for vLLM run here: every prompt form vLLM takes gives the tokens of the equivalent
plain call; a SentencePiece completion keeps its leading space (as transformers decodes prompt +
completion); vLLM's LLM(...) arguments and SamplingParams fields are accepted at their defaults and
refused by name otherwise; allowed_token_ids and bad_words follow vLLM's rules (checked against
transformers' logits); chat renders the tokenizer's template; the profiler writes a trace of the
model's operators."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest
import torch
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.engine.detokenizer import IncrementalDetokenizer
from minirunner.sampling_params import _DEFAULT_ONLY, RequestOutputKind

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
TEXTS = ["all that", "the quick brown", "to be or not", "a stitch in"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama with a SentencePiece-style (Metaspace, ▁-prefixed) tokenizer, and its HF model."""
    path, model = make_tiny_model(tmp_path_factory.mktemp("vllm_api"), "llama")
    add_tokenizer(path)
    return path, model


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(str(tiny[0]), dtype="float32", device="cpu", attention_backend="torch",
               num_threads=1, enable_prefix_caching=True, block_size=4)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


# -- prompt forms ---------------------------------------------------------------------------------
def test_every_prompt_form_gives_the_tokens_of_the_plain_call(llm):
    tok = llm.get_tokenizer()
    ids = [tok.encode(t) for t in TEXTS]
    plain = _tokens(llm.generate(TEXTS, GREEDY, use_tqdm=False))
    assert _tokens(llm.generate(ids, GREEDY, use_tqdm=False)) == plain
    assert _tokens(llm.generate([{"prompt": t} for t in TEXTS], GREEDY, use_tqdm=False)) == plain
    assert _tokens(llm.generate([{"prompt_token_ids": i} for i in ids], GREEDY, use_tqdm=False)) == plain
    mixed = [TEXTS[0], ids[1], {"prompt": TEXTS[2]}, {"prompt_token_ids": ids[3]}]
    outs = llm.generate(mixed, [GREEDY] * 4, use_tqdm=False)
    assert _tokens(outs) == plain
    assert [o.prompt for o in outs] == [TEXTS[0], None, TEXTS[2], None]
    assert all(o.prompt_token_ids == i and o.finished for o, i in zip(outs, ids, strict=True))
    # A single dict is one prompt (not its keys), as is a single list of token ids.
    one = llm.generate({"prompt_token_ids": ids[0]}, GREEDY, use_tqdm=False)
    assert len(one) == 1 and _tokens(one) == plain[:1]
    assert _tokens(llm.generate({"prompt": TEXTS[1]}, GREEDY, use_tqdm=False)) == plain[1:2]
    assert _tokens(llm.generate(ids[2], GREEDY, use_tqdm=False)) == plain[2:3]
    rid = llm.engine.add_request({"prompt_token_ids": ids[3]}, GREEDY)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert llm.engine.pop_finished(rid).outputs[0].token_ids == plain[3]


@pytest.mark.parametrize("prompts", [3, None, [1.5, 2.0], ["ok", 7], b"bytes"])
def test_a_prompt_of_no_known_form_is_a_type_error_naming_it(llm, prompts):
    with pytest.raises(TypeError, match="prompt"):
        llm.generate(prompts, GREEDY, use_tqdm=False)


@pytest.mark.parametrize("prompt, words", [
    ({"prompt": "all", "multi_modal_data": {"image": object()}}, "multi_modal_data"),
    ({"prompt_token_ids": [5, 6], "prompt_embeds": torch.zeros(2, 4)}, "prompt_embeds"),
    ({"text": "all"}, "unknown key 'text'"),
    ({}, "neither"),
    ({"prompt_token_ids": []}, "empty"),
    ({"prompt_token_ids": [5, 500]}, "vocabulary"),
    ({"prompt_token_ids": ["a"]}, "prompt_token_ids"),
])
def test_bad_prompt_dicts_are_refused_by_index_before_any_work(llm, prompt, words):
    steps = len(llm.engine.trace)
    with pytest.raises(ValueError, match=rf"prompt 1\b.*{words}"):
        llm.generate(["all that", prompt], GREEDY, use_tqdm=False)
    assert len(llm.engine.trace) == steps and not llm.engine.requests


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    ids = llm.get_tokenizer().encode("the quick brown fox jumps over the lazy dog")
    cut = llm.generate(ids, dataclasses.replace(GREEDY, truncate_prompt_tokens=4), use_tqdm=False)[0]
    assert cut.prompt_token_ids == ids[-4:]
    assert cut.outputs[0].token_ids == _tokens(llm.generate(ids[-4:], GREEDY, use_tqdm=False))[0]


# -- the leading space of a SentencePiece completion ------------------------------------------------
def test_sentencepiece_completion_keeps_its_leading_space(llm):
    """The completion's text is transformers' decode of prompt + completion minus the prompt's decode,
    streamed and final alike, so a first token "▁glit" reads " glit" (decoded alone it reads "glit")."""
    tok = llm.get_tokenizer()
    spaced = 0
    for seed in range(4):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=10, ignore_eos=True)
        for text in TEXTS:
            streamed, final = "", None
            for chunk in llm.stream(text, params):
                streamed += chunk.new_text
                final = chunk.output or final
            out = final.outputs[0]
            whole = tok.decode(final.prompt_token_ids + out.token_ids, skip_special_tokens=True)
            head = tok.decode(final.prompt_token_ids, skip_special_tokens=True)
            assert whole.startswith(head)
            assert out.text == streamed == whole[len(head):]
            if tok.convert_ids_to_tokens(out.token_ids[0]).startswith("\u2581"):
                spaced += 1
                assert out.text.startswith(" ")
                assert not tok.decode(out.token_ids[:1]).startswith(" "), "decoded alone it drops it"
    assert spaced >= 3, "the sampled completions should include ▁-prefixed first tokens"


def test_first_stop_string_in_the_list_wins_on_the_same_token(llm):
    """Both stop strings complete on the token "▁glit": vLLM takes the first one listed."""
    tok = llm.get_tokenizer()
    ids = tok.encode("all that glitters")
    assert tok.convert_ids_to_tokens(ids[2]) == "\u2581glit"
    for stop, text in ((["it", "glit"], "all that gl"), (["glit", "it"], "all that ")):
        detok = IncrementalDetokenizer(tok, stop=stop)
        found = [detok.append(t) for t in ids[:3]]
        assert found == [None, None, stop[0]] and detok.output_text == text


# -- LLM(...) arguments ---------------------------------------------------------------------------
def test_vllm_engine_arguments_are_accepted_with_vllm_meaning(tiny, llm, tmp_path):
    model_dir, _ = tiny
    weights_only = tmp_path / "weights_only"  # a model directory without tokenizer files
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, weights_only / name)
    other = LLM(str(weights_only), dtype="float32", device="cpu", num_threads=1,
                tokenizer=str(model_dir), tokenizer_mode="auto", trust_remote_code=False,
                tensor_parallel_size=1, seed=3, max_logprobs=30, disable_log_stats=False,
                enable_chunked_prefill=True, generation_config="vllm", kv_cache_dtype="auto",
                swap_space=4, enforce_eager=True, quantization=None, load_format="safetensors",
                served_model_name="tiny", disable_custom_all_reduce=True)
    assert _tokens(other.generate(TEXTS, GREEDY, use_tqdm=False)) == \
        _tokens(llm.generate(TEXTS, GREEDY, use_tqdm=False))
    asked = dataclasses.replace(GREEDY, logprobs=25, max_tokens=2)
    out = other.generate("all that", asked, use_tqdm=False)[0].outputs[0]
    assert all(len(step) >= 25 for step in out.logprobs)
    with pytest.raises(ValueError, match=r"prompt 0\b.*max_logprobs=20"):
        llm.generate("all that", asked, use_tqdm=False)  # vLLM's default max_logprobs is 20


@pytest.mark.parametrize("kwargs, words", [
    (dict(trust_remote_code=True), "trust_remote_code"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size"),
    (dict(pipeline_parallel_size=2), "pipeline_parallel_size"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype"),
    (dict(enable_chunked_prefill=False), "enable_chunked_prefill"),
    (dict(quantization="awq"), "quantization"),
    (dict(load_format="pt"), "load_format"),
    (dict(generation_config="nowhere"), "generation_config"),
    (dict(tokenizer_mode="mistral"), "tokenizer_mode"),
    (dict(max_logprobs=-1), "max_logprobs"),
    (dict(swap_space=-1), "swap_space"),
    (dict(no_such_argument=1), "no_such_argument"),
])
def test_unsupported_engine_arguments_raise_value_error_naming_them(tiny, kwargs, words):
    with pytest.raises(ValueError, match=words):
        LLM(str(tiny[0]), device="cpu", num_threads=1, **kwargs)


def test_default_sampling_params_come_from_generation_config(tiny, tmp_path):
    model_dir = tmp_path / "with_defaults"
    shutil.copytree(tiny[0], model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": 2, "temperature": 0.0, "top_k": 5, "max_new_tokens": 7}))
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_threads=1)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.0, 5, 7)
    plain = llm.generate(TEXTS, use_tqdm=False)  # sampling_params=None: the model's defaults
    assert _tokens(plain) == _tokens(llm.generate(
        TEXTS, SamplingParams(temperature=0.0, max_tokens=7), use_tqdm=False))
    vllm_defaults = LLM(str(model_dir), device="cpu", num_threads=1, generation_config="vllm")
    assert vllm_defaults.get_default_sampling_params() == SamplingParams()


def test_reset_prefix_cache_and_engine_handle(llm):
    prompt = llm.get_tokenizer().encode("the quick brown fox jumps over the lazy dog")
    assert llm.llm_engine is llm.engine
    llm.generate(prompt, GREEDY, use_tqdm=False)
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens > 0
    assert llm.reset_prefix_cache() is True
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 0


# -- SamplingParams fields ------------------------------------------------------------------------
def test_every_vllm_sampling_field_at_its_default_changes_nothing(llm):
    # vLLM's SamplingParams fields at vLLM's defaults (vllm/sampling_params.py, old and new releases)
    defaults = dict(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                    top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=None, stop_token_ids=None,
                    min_tokens=0, logprobs=None, prompt_logprobs=None, detokenize=True,
                    skip_special_tokens=True, spaces_between_special_tokens=True,
                    include_stop_str_in_output=False, output_kind=RequestOutputKind.CUMULATIVE,
                    logits_processors=None, truncate_prompt_tokens=None, guided_decoding=None,
                    structured_outputs=None, logit_bias=None, allowed_token_ids=None,
                    extra_args=None, bad_words=None, best_of=None, stream_interval=None,
                    skip_clone=False, flat_logprobs=False, logprob_token_ids=None,
                    prompt_logprob_token_ids=None, prompt_logprob_start=None,
                    skip_reading_prefix_cache=None, thinking_token_budget=None,
                    repetition_detection=None, routed_experts_prompt_start=0,
                    trace_decode_token_ids=None)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **defaults)
    assert _tokens(llm.generate(TEXTS, params, use_tqdm=False)) == \
        _tokens(llm.generate(TEXTS, GREEDY, use_tqdm=False))
    assert SamplingParams(seed=-1).seed is None  # vLLM: -1 asks for unseeded sampling
    assert SamplingParams(logprobs=True).logprobs == 1



def test_detokenize_false_gives_token_ids_only(llm):
    """vLLM's rule: no text, and logprobs without decoded tokens; the tokens are unchanged."""
    quiet = llm.generate(TEXTS[0], dataclasses.replace(GREEDY, detokenize=False, logprobs=3,
                                                       prompt_logprobs=3), use_tqdm=False)[0]
    assert quiet.outputs[0].text == "" and quiet.outputs[0].token_ids == \
        _tokens(llm.generate(TEXTS[0], GREEDY, use_tqdm=False))[0]
    for step in quiet.prompt_logprobs[1:] + quiet.outputs[0].logprobs:
        assert 3 <= len(step) <= 4 and all(lp.decoded_token is None for lp in step.values())


def test_first_stop_token_reached_ends_the_output_whatever_the_list_order(llm):
    free = _tokens(llm.generate(TEXTS[1], dataclasses.replace(GREEDY, max_tokens=12),
                                use_tqdm=False))[0]
    first, second = free[5], free[6]
    end = free.index(first) + 1
    for stops in ([second, first], [first, second]):
        out = llm.generate(TEXTS[1], dataclasses.replace(GREEDY, max_tokens=12, stop_token_ids=stops),
                           use_tqdm=False)[0].outputs[0]
        stop_at = min(end, free.index(second) + 1)
        assert out.token_ids == free[:stop_at] and out.stop_reason == free[stop_at - 1]


NON_DEFAULT = {"best_of": 2, "spaces_between_special_tokens": False, "logits_processors": [abs],
               "structured_outputs": {"json": "{}"}, "guided_decoding": {"regex": "a+"},
               "stream_interval": 4, "flat_logprobs": True, "logprob_token_ids": [3],
               "prompt_logprob_token_ids": [3], "prompt_logprob_start": 2,
               "skip_reading_prefix_cache": True, "thinking_token_budget": 10,
               "repetition_detection": {"min_count": 2}, "routed_experts_prompt_start": 1,
               "trace_decode_token_ids": [3, 4]}


@pytest.mark.parametrize("name", sorted(_DEFAULT_ONLY))
def test_unsupported_sampling_value_raises_naming_the_field(name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: NON_DEFAULT[name]})


@pytest.mark.parametrize("kwargs, words", [
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[-1]), "allowed_token_ids"),
    (dict(bad_words="word"), "bad_words"),
    (dict(bad_words=[""]), "bad_words"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    (dict(detokenize=False, stop=["x"]), "detokenize"),
])
def test_bad_vllm_field_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def _hf_greedy_masked(model, prompt, steps, mask_fn):
    """transformers' greedy decoding with mask_fn(output so far) -> token ids set to -inf."""
    out = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1].float()
        banned = list(mask_fn(out))
        if banned:
            logits[banned] = float("-inf")
        out.append(int(logits.argmax()))
    return out


def test_allowed_token_ids_match_transformers_restricted_argmax(llm, tiny):
    model = tiny[1]
    tok = llm.get_tokenizer()
    allowed = [5, 17, 33, 40, 61, 70]
    params = dataclasses.replace(GREEDY, allowed_token_ids=allowed)
    others = [t for t in range(model.config.vocab_size) if t not in allowed]
    for text, out in zip(TEXTS, llm.generate(TEXTS, params, use_tqdm=False), strict=True):
        ref = _hf_greedy_masked(model, tok.encode(text), 8, lambda _: others)
        assert out.outputs[0].token_ids == ref and set(ref) <= set(allowed)


def _word_ids(tok, word):
    """vLLM's tokenisation of one bad word: as it starts a text, and with a leading space when that
    gives another first token and as many tokens."""
    plain = tok.encode(word, add_special_tokens=False)
    spaced = tok.encode(" " + word, add_special_tokens=False)
    return [plain] + ([spaced] if spaced[0] != plain[0] and len(spaced) == len(plain) else [])


@pytest.mark.parametrize("length", [1, 2])
def test_bad_words_follow_vllm_rule_against_transformers(llm, tiny, length):
    model, tok = tiny[1], llm.get_tokenizer()
    free = llm.generate(TEXTS, dataclasses.replace(GREEDY, max_tokens=12), use_tqdm=False)
    word = None
    for out in free:  # a word of `length` tokens that the free greedy output contains
        ids = out.outputs[0].token_ids
        for j in range(len(ids) - length + 1):
            text = tok.decode(ids[j:j + length]).strip()
            if text and ids[j:j + length] in _word_ids(tok, text):
                word, prompt = text, out.prompt
                break
        if word:
            break
    assert word is not None, "the free outputs should contain a canonically tokenised word"
    words = _word_ids(tok, word)

    def banned(out):
        return [w[-1] for w in words if len(w) - 1 <= len(out)
                and (len(w) == 1 or out[len(out) - len(w) + 1:] == w[:-1])]

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, bad_words=[word])
    got = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == _hf_greedy_masked(model, tok.encode(prompt), 12, banned)
    assert got != next(o.outputs[0].token_ids for o in free if o.prompt == prompt)
    assert params.bad_words == [word], "the user's params are unchanged"


# -- chat and the profiler ------------------------------------------------------------------------
def test_chat_renders_the_template_and_equals_generate(tiny, llm, tmp_path):
    model_dir = tmp_path / "chat"
    shutil.copytree(tiny[0], model_dir)
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}assistant:{% endif %}")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    chat_llm = LLM(str(model_dir), dtype="float32", device="cpu", num_threads=1)
    conversations = [[{"role": "user", "content": "to be or not"}],
                     [{"role": "system", "content": "all that"}, {"role": "user", "content": "fox"}]]
    rendered = ["user: to be or not\nassistant:", "system: all that\nuser: fox\nassistant:"]
    outs = chat_llm.chat(conversations, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == rendered
    assert _tokens(outs) == _tokens(chat_llm.generate(rendered, GREEDY, use_tqdm=False))
    assert _tokens(chat_llm.chat(conversations[0], GREEDY, use_tqdm=False)) == _tokens(outs[:1])
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat(conversations[0], GREEDY, use_tqdm=False)


def test_profiler_writes_a_trace_of_the_steps(llm, tmp_path, capsys):
    llm.start_profile(tmp_path)
    llm.generate(TEXTS[:2], GREEDY, use_tqdm=False)
    path = llm.stop_profile()
    assert str(path) in capsys.readouterr().out and path.parent == tmp_path
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert "LLMEngine.step" in names
    # projections of more than one row run on weights packed for oneDNN where the CPU takes them
    linear = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "mkldnn::_linear_pointwise"}
    assert names & linear, "model ops traced"
    with pytest.raises(ValueError, match="start_profile"):
        llm.stop_profile()


# -- the transformers baseline of `minirunner bench` -----------------------------------------------
def test_bench_transformers_baseline_prints_no_generation_warnings(tiny, tmp_path):
    """A checkpoint whose generation_config.json sets max_length and sampling defaults (as published
    models do) makes transformers warn on every greedy max_new_tokens batch unless the baseline passes
    its own greedy config; the figures stay those of the same greedy run. In a fresh process, where
    transformers' logging goes to the real stderr."""
    model_dir = tmp_path / "published"
    shutil.copytree(tiny[0], model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "max_length": 256,
         "temperature": 0.8, "top_p": 0.95, "do_sample": True}))
    script = (
        "import sys, torch\n"
        "from minirunner.tools.bench.run import run_transformers\n"
        "from minirunner.tools.bench.workloads import make_workload\n"
        "w = make_workload('nano', 4, 96, 64, input_len=(4, 8), output_len=(3, 6))\n"
        "r = run_transformers(sys.argv[1], w, 2, torch.float32, torch.device('cpu'))\n"
        "print(r.output_tokens == w.num_output_tokens)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(model_dir)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("True"), proc.stderr[-2000:]
    for words in ("max_length", "max_new_tokens", "generation flags", "do_sample", "temperature"):
        assert words not in proc.stderr, proc.stderr[-2000:]

"""Streaming is exact: a completion's chunks concatenate to its final text for stop strings spanning 2-3
tokens, multi-byte characters split across byte-level tokens, and every way a request can end."""

from __future__ import annotations

import pytest
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.engine.detokenizer import IncrementalDetokenizer

MULTIBYTE = "naïve café — 日本語 🙂 ok ü 🚀"


def _byte_level_tokenizer(path, vocab_size: int):
    """A byte-level BPE (GPT-2 style) with few merges, so multi-byte characters span tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox " * 20], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    fast.save_pretrained(path)
    return fast


@pytest.fixture(scope="module")
def metaspace_llm(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("stream"), "llama_gqa")
    add_tokenizer(path)
    return LLM(str(path), dtype="float32", device="cpu", attention_backend="torch")


@pytest.fixture(scope="module")
def byte_llm(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("bytes"), "llama", vocab_size=300)
    _byte_level_tokenizer(path, 300)
    return LLM(str(path), dtype="float32", device="cpu", attention_backend="torch")


def _stream(llm, prompts, params):
    """Run llm.stream; returns {(prompt, completion): concatenated text} and the final outputs."""
    texts, finals = {}, {}
    for chunk in llm.stream(prompts, params):
        key = (chunk.index, chunk.output_index)
        # Random byte tokens can make invalid UTF-8 (a lasting U+FFFD); an incomplete character at
        # the end of the text is what must never go out before the request ends.
        assert not chunk.new_text.endswith("\ufffd") or chunk.finished, "streamed a partial character"
        texts[key] = texts.get(key, "") + chunk.new_text
        if chunk.output is not None:
            finals[chunk.index] = chunk.output
    return texts, finals


def test_detokenizer_never_streams_half_a_character(tmp_path):
    tok = _byte_level_tokenizer(tmp_path, 270)
    ids = tok.encode(MULTIBYTE, add_special_tokens=False)
    assert len(ids) > len(MULTIBYTE), "multi-byte characters should span several tokens"
    detok = IncrementalDetokenizer(tok)
    chunks = []
    for t in ids:
        detok.append(t)
        chunks.append(detok.take_delta())
    detok.finish()
    chunks.append(detok.take_delta())
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == MULTIBYTE == detok.output_text
    assert sum(1 for c in chunks if c == "") > 0, "some tokens end mid-character and must wait"


def test_detokenizer_holds_back_a_possible_stop_string(tmp_path):
    tok = _byte_level_tokenizer(tmp_path, 270)
    text = "the quick brown fox jumps"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop=["fox j"])
    sent, stopped = "", None
    for t in ids:
        stopped = detok.append(t)
        sent += detok.take_delta()
        assert not sent.endswith(("f", "fo", "fox", "fox ")), f"streamed a stop prefix: {sent!r}"
        if stopped:
            break
    detok.finish(stopped_by_string=True)
    sent += detok.take_delta()
    assert stopped == "fox j" and sent == detok.output_text == "the quick brown "


def _token_boundaries(tok, ids):
    """Character offset at which each output token's text ends (decoding prefixes)."""
    return [len(tok.decode(ids[:j], skip_special_tokens=True)) for j in range(1, len(ids) + 1)]


@pytest.mark.parametrize("span", [2, 3])
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens(metaspace_llm, span, include):
    llm = metaspace_llm
    tok = llm.get_tokenizer()
    prompts = ["the quick", "all that glitters", "to be or"]
    free = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)
    stops = []
    for out in free:
        ids, full = out.outputs[0].token_ids, out.outputs[0].text
        ends = _token_boundaries(tok, ids)
        # A stop string from the last character of token j to the first of token j + span - 1.
        j = next(j for j in range(2, len(ids) - span)
                 if all(ends[k] < ends[k + 1] for k in range(j - 1, j + span - 1)))
        stops.append(full[ends[j] - 1:ends[j + span - 2] + 1])
    for i, stop in enumerate(stops):
        full = free[i].outputs[0].text
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop],
                                include_stop_str_in_output=include)
        texts, finals = _stream(llm, [prompts[i]], params)
        final = finals[0].outputs[0]
        pos = full.find(stop)
        assert final.finish_reason == "stop" and final.stop_reason == stop
        assert final.text == full[:pos + (len(stop) if include else 0)]
        assert texts[(0, 0)] == final.text
        assert llm.generate([prompts[i]], params, use_tqdm=False)[0].outputs[0].text == final.text


def test_multibyte_output_streams_exactly(byte_llm):
    prompts = [[5, 6, 7], [100, 200, 250, 3], [33] * 9]
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=40, ignore_eos=True)
    texts, finals = _stream(byte_llm, prompts, params)
    tok = byte_llm.get_tokenizer()
    for i, out in finals.items():
        final = out.outputs[0]
        assert texts[(i, 0)] == final.text
        assert final.text == tok.decode(final.token_ids, skip_special_tokens=True)
    assert any(ord(c) > 127 for out in finals.values() for c in out.outputs[0].text), \
        "random byte tokens should have produced some multi-byte text"


@pytest.mark.parametrize("how", ["eos", "stop_token", "length", "stop_string", "n=3"])
def test_every_stop_condition_streams_exactly(metaspace_llm, how):
    llm = metaspace_llm
    prompt = "the quick"
    base = dict(temperature=0, max_tokens=16)
    free = llm.generate([prompt], SamplingParams(**base, ignore_eos=True), use_tqdm=False)[0]
    ids = free.outputs[0].token_ids
    params = {
        # EOS (</s> = 2) pushed to the top by logit_bias, held off by min_tokens until 4 tokens.
        "eos": SamplingParams(**base, logit_bias={2: 100.0}, min_tokens=4),
        "stop_token": SamplingParams(**base, ignore_eos=True, stop_token_ids=[ids[5]]),
        "length": SamplingParams(**base, ignore_eos=True),
        "stop_string": SamplingParams(**base, ignore_eos=True, stop=free.outputs[0].text[6:8]),
        "n=3": SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=16, ignore_eos=True,
                              stop=["e"]),
    }[how]
    texts, finals = _stream(llm, [prompt], params)
    out = finals[0]
    for c in out.outputs:
        assert texts[(0, c.index)] == c.text
    first = out.outputs[0]
    if how == "eos":
        assert first.token_ids == ids[:4] + [2] and first.stop_reason is None
        assert first.finish_reason == "stop" and first.text == free.outputs[0].text[:len(first.text)]
    elif how == "stop_token":
        assert first.token_ids == ids[:ids.index(ids[5]) + 1] and first.stop_reason == ids[5]
        # As vLLM: the stop token's own text is not in the output.
        tok = llm.get_tokenizer()
        assert first.text == tok.decode(first.token_ids[:-1], skip_special_tokens=True)
    elif how == "length":
        assert first.finish_reason == "length" and first.text == free.outputs[0].text
    elif how == "n=3":
        assert [c.index for c in out.outputs] == [0, 1, 2]


def test_a_stop_string_may_begin_inside_min_tokens(tmp_path):
    # vLLM's example: one letter per token, stop=["cd"], min_tokens=3 on "abcdef" gives "ab" and stop
    # reason "cd": the match must end after the first 3 tokens' text, and may begin inside it.
    add_tokenizer(tmp_path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok.convert_tokens_to_ids(list("abcdef"))
    assert tok.decode(ids) == "abcdef"
    for stop, expected in ((["cd"], "ab"), (["bc"], None), (["abcd"], "")):
        detok = IncrementalDetokenizer(tok, stop=stop, min_tokens=3)
        sent, stopped = "", None
        for t in ids:
            stopped = detok.append(t)
            sent += detok.take_delta()
            if stopped:
                break
        detok.finish(stopped_by_string=stopped is not None)
        sent += detok.take_delta()
        if expected is None:  # "bc" ends inside the first 3 tokens' text: never a stop
            assert stopped is None and sent == detok.output_text == "abcdef"
        else:
            assert stopped == stop[0] and sent == detok.output_text == expected


def test_stop_straddling_min_tokens_stops_the_request(metaspace_llm):
    llm = metaspace_llm
    prompt, m = "the quick", 4
    params = dict(temperature=0, max_tokens=16, ignore_eos=True)
    full = llm.generate([prompt], SamplingParams(**params), use_tqdm=False)[0].outputs[0].text
    head = llm.generate([prompt], SamplingParams(**{**params, "max_tokens": m}),
                        use_tqdm=False)[0].outputs[0].text
    assert full.startswith(head) and len(full) > len(head)
    boundary = len(head)  # the text of the first min_tokens tokens
    stop = full[boundary - 1:boundary + 1]  # its last character and the next one
    # vLLM's rule, independently: the first occurrence that ends after the boundary
    pos = next(p for p in range(len(full)) if full.startswith(stop, p) and p + len(stop) > boundary)
    sampling = SamplingParams(**params, stop=[stop], min_tokens=m)
    texts, finals = _stream(llm, [prompt], sampling)
    final = finals[0].outputs[0]
    assert (final.finish_reason, final.stop_reason) == ("stop", stop)
    assert final.text == full[:pos] == texts[(0, 0)]


def test_detokenizer_text_is_transformers_decode(tmp_path):
    """The detokenizer's decoder (the Rust backend's decode, called directly, for a plain fast tokenizer)
    gives transformers' ``decode`` text for every window it may decode: many prompts' tokens, random
    token ids (invalid and partial UTF-8), multi-byte characters cut anywhere, special tokens kept or
    skipped; a tokenizer that cleans up spaces keeps transformers' decode."""
    import random

    from minirunner.assets import default_model_dir
    from minirunner.engine.detokenizer import decoder_for
    from minirunner.tokenizer import load_tokenizer

    texts = [MULTIBYTE, "ROMEO:\nBut soft, what light", "  spaces  and\ttabs\n\n", "ü🙂日本", "a</s>b<s>"]
    rng = random.Random(0)
    for tok in (_byte_level_tokenizer(tmp_path, 270), load_tokenizer(default_model_dir())):
        decode = decoder_for(tok)
        assert decode == tok.backend_tokenizer.decode  # the fast path is taken
        sequences = [tok.encode(t, add_special_tokens=False) for t in texts]
        sequences += [[rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 12))]
                      for _ in range(300)]
        for ids in sequences:
            for i in range(len(ids)):
                for j in range(i + 1, min(len(ids), i + 8) + 1):
                    for skip in (True, False):
                        assert decode(ids[i:j], skip) == tok.decode(ids[i:j], skip_special_tokens=skip)
        # a whole incremental run gives transformers' decode of the output, streamed exactly
        ids = tok.encode(MULTIBYTE, add_special_tokens=False)
        detok = IncrementalDetokenizer(tok)
        sent = ""
        for t in ids:
            detok.append(t)
            sent += detok.take_delta()
        detok.finish()
        sent += detok.take_delta()
        assert sent == detok.output_text == tok.decode(ids, skip_special_tokens=True)
    cleaning = _byte_level_tokenizer(tmp_path / "clean", 270)
    cleaning.clean_up_tokenization_spaces = True
    assert decoder_for(cleaning) != cleaning.backend_tokenizer.decode
    assert decoder_for(cleaning)([5, 6], True) == cleaning.decode([5, 6], skip_special_tokens=True)

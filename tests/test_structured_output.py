"""Structured output offline: SamplingParams(structured_outputs=StructuredOutputsParams(...)) through
xgrammar. For 50 seeded samples at temperature 1 each, every JSON output parses and validates against
its schema, every regex output matches, every choice output is a choice — with the synchronous engine,
with async scheduling (equal to the synchronous engine's) and with n-gram speculation (whose drafts are
checked against the grammar; greedy, equal to plain decoding); and
without the constraint the same samples are not JSON (the negative control). Also: a bad schema, regex
or grammar is a ValueError at add time while the engine keeps serving, the one-constraint rule, a
refused draft never advancing the matcher, the mask op against xgrammar's own, and a -inf token never
sampled whatever the noise.
"""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest
import torch

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from minirunner import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from minirunner.kernels.sampling import sample_ref  # noqa: E402
from minirunner.structured_output.bitmask import apply_grammar_bitmasks  # noqa: E402
from minirunner.structured_output.compiler import GrammarCompiler  # noqa: E402
from minirunner.structured_output.manager import StructuredOutputManager  # noqa: E402

N = 50
PROMPT = "ROMEO:"
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "mood": {"enum": ["merry", "sad", "wroth"]}},
          "required": ["name", "age", "mood"], "additionalProperties": False}
REGEX = r"(Ay|Nay), [a-z]{2,8}( [a-z]{2,8}){0,3}[.!]"
CHOICES = ["my lord", "madam", "good sir", "Romeo"]
CONSTRAINTS = {
    "json": StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
    "regex": StructuredOutputsParams(regex=REGEX),
    "choice": StructuredOutputsParams(choice=CHOICES),
}
ENGINES = {"sync": {}, "async": {"async_scheduling": True},
           "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}}


@pytest.fixture(scope="module")
def llms():
    return {name: LLM(num_threads=1, **kw) for name, kw in ENGINES.items()}


def _params(structured, n=N, max_tokens=100, **kw):
    return [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, structured_outputs=structured,
                           **kw) for i in range(n)]


def _texts(llm, params):
    outs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    return [(c.text, c.finish_reason, list(c.token_ids)) for o in outs for c in o.outputs]


def _holds(kind: str, text: str) -> bool:
    if kind == "json":
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    return text in CHOICES


def _accepted(llm, name: str) -> float:
    return next(m.value for m in llm.get_metrics() if m.name == name)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_50_seeded_samples_hold_their_constraint(llms, engine):
    llm = llms[engine]
    for kind, structured in CONSTRAINTS.items():
        before = _accepted(llm, "vllm:spec_decode_num_draft_tokens") if engine == "ngram" else 0
        outs = _texts(llm, _params(structured))
        bad = [text for text, _, _ in outs if not _holds(kind, text)]
        assert not bad, f"{engine} {kind}: {len(bad)} of {N} outputs break the constraint, e.g. {bad[:3]}"
        assert all(reason == "stop" for _, reason, _ in outs)  # a completed grammar allows EOS
        assert len({text for text, _, _ in outs}) > 1  # temperature 1: the mask, not the model, decides
        if engine == "ngram":  # drafts were verified under the grammar (k > 0), not turned off
            assert _accepted(llm, "vllm:spec_decode_num_draft_tokens") > before
        if engine == "async":  # the same seeded samples as the synchronous engine
            assert outs == _texts(llms["sync"], _params(structured))


def test_greedy_speculation_equals_plain_decoding_under_the_grammar(llms):
    """Greedy verification is exact: with the mask on the verified rows, n-gram speculation emits what
    plain greedy decoding under the same grammar does."""
    prompts = ["ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:", "HAMLET:", "Nurse:"]
    for structured in CONSTRAINTS.values():
        params = SamplingParams(temperature=0, max_tokens=100, structured_outputs=structured)
        spec, plain = (llms[e].generate(prompts, params, use_tqdm=False) for e in ("ngram", "sync"))
        assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]


def test_without_the_constraint_the_samples_are_not_json(llms):
    outs = _texts(llms["sync"], _params(None))
    assert not all(_holds("json", text) for text, _, _ in outs)


def test_json_object_and_n_completions(llms):
    outs = _texts(llms["sync"], [SamplingParams(n=4, temperature=1.0, seed=i, max_tokens=60,
                                                structured_outputs=StructuredOutputsParams(
                                                    json={"type": "object", "properties": {
                                                        "ok": {"type": "boolean"}}, "required": ["ok"],
                                                        "additionalProperties": False},
                                                    disable_any_whitespace=True))
                                 for i in range(3)])
    assert len(outs) == 12
    assert all(isinstance(json.loads(text)["ok"], bool) for text, _, _ in outs)


def test_max_tokens_may_cut_json_early(llms):
    """As in vLLM: finish_reason "length", and the text is a prefix the grammar accepts."""
    structured = CONSTRAINTS["json"]
    outs = _texts(llms["sync"], _params(structured, n=5, max_tokens=4))
    compiled = llms["sync"].engine.structured.compiler.compile(structured)
    for text, reason, ids in outs:
        assert reason == "length" and len(ids) == 4
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(t) for t in ids)
        with pytest.raises(ValueError):
            json.loads(text)


@pytest.mark.parametrize("kw, error", [
    ({"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "structured_outputs.json"),
    ({"regex": "(ab"}, "structured_outputs.regex"),
    ({"grammar": "root ::= undefined_rule"}, "structured_outputs.grammar"),
])
def test_a_bad_spec_is_refused_at_add_time_and_the_engine_keeps_serving(llms, kw, error):
    llm = llms["sync"]
    with pytest.raises(ValueError, match=re.escape(error)):
        llm.generate(PROMPT, SamplingParams(structured_outputs=StructuredOutputsParams(**kw)), use_tqdm=False)
    text, _, _ = _texts(llm, _params(CONSTRAINTS["choice"], n=1))[0]
    assert text in CHOICES


def test_exactly_one_constraint():
    with pytest.raises(ValueError, match="but none are specified"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="multiple are specified"):
        StructuredOutputsParams(json=SCHEMA, regex="a")
    with pytest.raises(ValueError, match="non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"json": SCHEMA})


def test_choices_with_quotes_backslashes_and_newlines(llms):
    choices = ['say "ay"', "back\\slash", "two\nlines"]
    outs = _texts(llms["sync"], _params(StructuredOutputsParams(choice=choices), n=12))
    assert all(text in choices for text, _, _ in outs)


def test_without_xgrammar_a_structured_request_names_the_extra(llms, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now raises ImportError
    compiler = GrammarCompiler(llms["sync"].get_tokenizer(), 1024, [0])
    with pytest.raises(ValueError, match=re.escape("minirunner[structured]")):
        compiler.compile(StructuredOutputsParams(regex="a+"))


def test_drafts_fill_one_mask_each_and_a_refused_draft_never_advances_the_matcher(llms):
    tok = llms["sync"].get_tokenizer()
    a, b = tok.convert_tokens_to_ids(["Ġwould", "Ġpri"])  # two one-token words, " would" and " pri"
    one, two = tok.decode([a]), tok.decode([b])
    manager = StructuredOutputManager(tok, 1024, [0])
    structured = StructuredOutputsParams(choice=[one + two, two + one])
    request = SimpleNamespace(request_id="r", params=SamplingParams(structured_outputs=structured),
                              output_token_ids=[], is_finished=False)

    def step(drafts):
        scheduled = SimpleNamespace(request=request, is_sampling=True, draft_token_ids=drafts)
        return manager.bitmasks([scheduled])["r"]

    def allowed(row):
        return {t for t in range(1024) if (row[t // 32] >> (t % 32)) & 1}

    first = step([])
    assert first.shape == (1, 32) and {a, b} <= allowed(first[0])
    # drafts: " would" (allowed), then " would" again (refused: only " pri" may follow), then anything
    masks = step([a, a, b])
    assert masks.shape == (4, 32)
    assert (masks[0] == first[0]).all()
    assert b in allowed(masks[1]) and a not in allowed(masks[1])
    assert (masks[2:] == -1).all()  # after a refused draft: never sampled from (its own row rejects it)
    assert (step([])[0] == first[0]).all()  # rolled back: the drafts did not advance the matcher
    manager.accept([(request, [a])])  # the token the step emitted does
    assert (step([])[0] == masks[1]).all()
    manager.accept([(request, [b, 0])])  # " pri", then EOS: the grammar is done
    assert (step([]) == -1).all()


def test_the_mask_op_equals_xgrammars(llms):
    compiler = GrammarCompiler(llms["sync"].get_tokenizer(), 1024, [0])
    matcher = xgr.GrammarMatcher(compiler.compile(StructuredOutputsParams(regex=REGEX)))
    bitmask = xgr.allocate_token_bitmask(2, 1024)
    matcher.fill_next_token_bitmask(bitmask, 0)
    matcher.accept_string("Ay, ")
    matcher.fill_next_token_bitmask(bitmask, 1)
    logits = torch.randn(2, 1024, generator=torch.Generator().manual_seed(0))
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask)
    rows = [SimpleNamespace(grammar_bitmask=bitmask[i:i + 1].numpy()) for i in range(2)]
    assert torch.equal(apply_grammar_bitmasks(logits, rows), expected)
    assert torch.equal(apply_grammar_bitmasks(logits, [SimpleNamespace(grammar_bitmask=bitmask.numpy())],
                                              num_drafts=[1]), expected)


def test_a_masked_token_is_never_sampled_whatever_the_noise():
    """Seeds 0..8191 at position 0 over 1024 columns: the hash noise reaches its top value there, which
    once rounded to u = 1 and made a -inf logit win."""
    n, vocab = 8192, 1024
    logits = torch.full((n, vocab), float("-inf"))
    logits[:, 7] = 0.0
    logits[:, 900] = 1.0
    tokens = sample_ref(logits, torch.ones(n), torch.full((n,), -1), torch.ones(n),
                        torch.arange(n), torch.zeros(n, dtype=torch.int64), apply_filters=False)
    assert set(tokens.tolist()) <= {7, 900}

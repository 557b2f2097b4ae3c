"""Structured output through `minirunner serve` and the real `openai` client: vLLM's `structured_outputs`
field, the older `guided_*` fields and OpenAI's `response_format`, on /v1/completions and
/v1/chat/completions. 50 seeded samples (n=50) each hold their JSON schema, regex or choice, equal to what
the offline LLM returns for the same constraint; a bad spec, or one asked for twice, is a 400 naming why."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
from serve_helpers import Server  # noqa: E402

from minirunner import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402

MODEL = "shakespeare"
N = 50
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
REGEX = r"(Ay|Nay), [a-z]{2,8}( [a-z]{2,8}){0,3}[.!]"
CHOICES = ["my lord", "madam", "good sir", "Romeo"]
SAMPLE = dict(temperature=1.0, top_p=1.0, seed=5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    template = Path(tmp_path_factory.mktemp("tpl")) / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}")
    s = Server("--chat-template", str(template))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def llm():
    return LLM(num_threads=1)


def _offline(llm, structured, max_tokens=100):
    params = SamplingParams(n=N, max_tokens=max_tokens, structured_outputs=structured, **SAMPLE)
    return [c.text for c in llm.generate("ROMEO:", params, use_tqdm=False)[0].outputs]


def test_completions_json_schema_regex_and_choice_hold_for_50_samples(client, llm):
    cases = [({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
              StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)),
             ({"guided_regex": REGEX}, StructuredOutputsParams(regex=REGEX)),
             ({"structured_outputs": {"choice": CHOICES}}, StructuredOutputsParams(choice=CHOICES))]
    for extra_body, structured in cases:
        r = client.completions.create(model=MODEL, prompt="ROMEO:", n=N, max_tokens=100,
                                      extra_body=extra_body, **SAMPLE)
        texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
        assert all(c.finish_reason == "stop" for c in r.choices)
        if "json" in str(extra_body):
            for text in texts:
                jsonschema.validate(json.loads(text), SCHEMA)
        elif "guided_regex" in extra_body:
            assert all(re.fullmatch(REGEX, text) for text in texts)
        else:
            assert set(texts) <= set(CHOICES)
        assert texts == _offline(llm, structured)


def test_chat_response_format_and_guided_fields(client):
    messages = [{"role": "user", "content": "Speak, lord."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, n=N, max_tokens=20,
                                       extra_body={"guided_choice": CHOICES}, **SAMPLE)
    assert {c.message.content for c in r.choices} <= set(CHOICES)
    # a schema with no room for whitespace: the JSON value is the whole output
    enum = {"enum": ["merry", "sad", "wroth"]}
    r = client.chat.completions.create(model=MODEL, messages=messages, n=N, max_tokens=20, **SAMPLE,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "mood", "schema": enum}})
    assert {json.loads(c.message.content) for c in r.choices} <= set(enum["enum"])
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **SAMPLE,
                                       response_format={"type": "json_object"})
    assert r.choices[0].message.content.startswith("{")


def test_completions_response_format_json_object_equals_offline(client, llm):
    r = client.completions.create(model=MODEL, prompt="ROMEO:", n=N, max_tokens=30, **SAMPLE,
                                  extra_body={"response_format": {"type": "json_object"}})
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert texts == _offline(llm, StructuredOutputsParams(json_object=True), max_tokens=30)
    assert all(t.startswith("{") for t in texts)


@pytest.mark.parametrize("extra_body, reason", [
    ({"structured_outputs": {"regex": "(ab"}}, "regular expression"),
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "JSON schema"),
    ({"guided_grammar": "root ::= undefined_rule"}, "grammar"),
    ({"structured_outputs": {}}, "none are specified"),
    ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "multiple are specified"),
    ({"guided_regex": "a+", "guided_choice": ["b"]}, "use only one"),
    ({"structured_outputs": {"pattern": "a+"}}, "unknown keys"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    ({"response_format": {"type": "structural_tag"}}, "not supported"),
])
def test_a_bad_structured_request_is_a_400_with_the_reason(client, extra_body, reason):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=5, extra_body=extra_body)
    assert reason in e.value.response.json()["error"]["message"]
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=20, **SAMPLE,
                                  extra_body={"guided_choice": CHOICES})
    assert r.choices[0].text in CHOICES  # the server keeps serving

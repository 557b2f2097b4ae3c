"""`minirunner serve` through the real `openai` client: completions whole and streamed, n, stop strings,
token-id prompts, logprobs, chat, usage, each equal to what the offline LLM returns for the same request."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")
from serve_helpers import Server  # noqa: E402

from minirunner import LLM, SamplingParams  # noqa: E402

MODEL = "shakespeare"
TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }}:\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}")


@pytest.fixture(scope="module")
def server():
    s = Server("--trust-request-chat-template")  # the chat test sends its template
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def llm():
    return LLM(num_threads=1)


def _sp(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.8, "top_p": 0.95, **kw})


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_plain_completion_equals_offline(client, llm):
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=20, temperature=0.8,
                                  top_p=0.95, seed=7)
    ref = llm.generate("ROMEO:", _sp(max_tokens=20, seed=7), use_tqdm=False)[0]
    assert r.choices[0].text == ref.outputs[0].text
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_token_ids), 20)
    assert r.usage.total_tokens == len(ref.prompt_token_ids) + 20


def test_streamed_deltas_concatenate_to_the_final_text(client, llm):
    stream = client.completions.create(model=MODEL, prompt="JULIET:", max_tokens=40, temperature=0.8,
                                       top_p=0.95, seed=11, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ref = llm.generate("JULIET:", _sp(max_tokens=40, seed=11), use_tqdm=False)[0]
    assert text == ref.outputs[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert all(c.usage is None for c in chunks[:-1])


def test_n_2_and_several_prompts(client, llm):
    prompts = ["ROMEO:", "HAMLET:"]
    r = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=12, temperature=0.8,
                                  top_p=0.95, seed=5)
    ref = llm.generate(prompts, _sp(n=2, max_tokens=12, seed=5), use_tqdm=False)
    got = {c.index: c.text for c in r.choices}
    assert got == {2 * i + c.index: c.text for i, o in enumerate(ref) for c in o.outputs}
    assert got[0] != got[1]  # two different samples of one prompt
    assert r.usage.completion_tokens == 4 * 12


def test_stop_string_ends_the_text(client, llm):
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=60, temperature=0, stop=["\n"])
    ref = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=60, stop=["\n"]),
                       use_tqdm=False)[0].outputs[0]
    assert ref.finish_reason == "stop"  # the case is real: greedy text hits a newline
    assert r.choices[0].text == ref.text and "\n" not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=60, temperature=0,
                                         stop="\n", stream=True)
    assert "".join(c.choices[0].text for c in streamed) == ref.text


def test_token_id_prompt(client, llm):
    ids = llm.get_tokenizer().encode("KING RICHARD:")
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0)
    ref = llm.generate([ids], SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0]
    assert r.choices[0].text == ref.outputs[0].text and r.usage.prompt_tokens == len(ids)


def test_logprobs(client, llm):
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=6, temperature=0, logprobs=3)
    ref = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=6, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    lp = r.choices[0].logprobs
    pairs = zip(ref.token_ids, ref.logprobs, strict=True)
    assert lp.token_logprobs == pytest.approx([d[t].logprob for t, d in pairs])
    assert "".join(lp.tokens) == r.choices[0].text
    for top, d in zip(lp.top_logprobs, ref.logprobs, strict=True):
        assert len(top) == 3  # greedy: the chosen token is among the top 3
        assert max(top.values()) == pytest.approx(max(x.logprob for x in d.values()))


def test_chat_with_a_template(client, llm):
    messages = [{"role": "user", "content": "Speak, ROMEO."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                       extra_body={"chat_template": TEMPLATE}, logprobs=True, top_logprobs=2)
    ref = llm.chat(messages, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False,
                   chat_template=TEMPLATE)[0]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.outputs[0].text
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert len(r.choices[0].logprobs.content) == 16
    assert all(len(t.top_logprobs) == 2 for t in r.choices[0].logprobs.content)
    streamed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                              extra_body={"chat_template": TEMPLATE}, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == ref.outputs[0].text


def test_chat_without_a_template_names_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert "chat template" in e.value.body["message"]


def test_vllm_extra_sampling_parameters(client, llm):
    extra = {"top_k": 5, "repetition_penalty": 1.3, "min_tokens": 8, "ignore_eos": True}
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=12, temperature=0.9, top_p=0.9,
                                  seed=3, extra_body=extra)
    ref = llm.generate("ROMEO:", SamplingParams(temperature=0.9, top_p=0.9, max_tokens=12, seed=3, **extra),
                       use_tqdm=False)[0]
    assert r.choices[0].text == ref.outputs[0].text

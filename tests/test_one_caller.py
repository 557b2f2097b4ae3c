"""One LLM serves one caller at a time (LLM._one_caller).

Two threads calling ``generate`` (or ``chat`` and ``stream``) on one LLM at once each get exactly what the
same call returns alone (seeded sampling: the same tokens), never an internal error. A ``generate``
from the thread whose ``stream()`` is suspended raises RuntimeError saying a stream is in progress, and
the stream then still yields every token it would have yielded alone; once the stream is closed, the
next call runs. A call from another thread waits for the suspended stream to finish.
"""

from __future__ import annotations

import threading

import pytest
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams

PARAMS = [SamplingParams(temperature=0.9, seed=s, max_tokens=24, ignore_eos=True) for s in range(6)]
PROMPTS = [[5 + i, 6, 7, 8 + i] for i in range(6)]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("one_caller"), "llama_gqa")[0]
    add_tokenizer(path)
    return LLM(path, device="cpu", attention_backend="torch", num_threads=1, num_kv_blocks=64,
               max_num_seqs=4, block_size=4)


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def _streamed(chunks) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    for c in chunks:
        got.setdefault(c.index, []).extend(c.new_token_ids)
    return got


def test_two_threads_generating_at_once_each_get_what_they_get_alone(llm):
    alone = [_tokens(llm.generate(PROMPTS[i::2], PARAMS[i::2], use_tqdm=False)) for i in range(2)]
    for _ in range(3):
        results, errors = [None, None], []
        barrier = threading.Barrier(2)

        def call(i, results=results, errors=errors, barrier=barrier):
            try:
                barrier.wait()
                results[i] = _tokens(llm.generate(PROMPTS[i::2], PARAMS[i::2], use_tqdm=False))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert results == alone


def test_a_stream_and_a_chat_from_two_threads_each_get_what_they_get_alone(llm):
    conversation = [{"role": "user", "content": "the quick brown fox"}]
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    chat_alone = _tokens(llm.chat(conversation, PARAMS[0], use_tqdm=False, chat_template=template))
    stream_alone = _streamed(llm.stream(PROMPTS[:3], PARAMS[:3]))
    results = {}

    def chat():
        results["chat"] = _tokens(llm.chat(conversation, PARAMS[0], use_tqdm=False, chat_template=template))

    def stream():
        results["stream"] = _streamed(llm.stream(PROMPTS[:3], PARAMS[:3]))

    threads = [threading.Thread(target=f) for f in (stream, chat)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {"chat": chat_alone, "stream": stream_alone}


def test_generate_inside_a_suspended_stream_raises_and_the_stream_loses_no_token(llm):
    alone = _streamed(llm.stream(PROMPTS[:2], PARAMS[:2]))
    assert all(len(t) == 24 for t in alone.values())
    stream = llm.stream(PROMPTS[:2], PARAMS[:2])
    chunks = [next(stream), next(stream)]
    with pytest.raises(RuntimeError, match="stream"):
        llm.generate(PROMPTS[2:3], PARAMS[2], use_tqdm=False)
    with pytest.raises(RuntimeError, match="stream"):
        next(llm.stream(PROMPTS[2:3], PARAMS[2]))
    chunks.extend(stream)
    assert _streamed(chunks) == alone
    # a stream closed early frees the LLM for the next call
    stream = llm.stream(PROMPTS[:2], PARAMS[:2])
    next(stream)
    stream.close()
    assert _tokens(llm.generate(PROMPTS[:1], PARAMS[0], use_tqdm=False))[0] == alone[0]


def test_another_threads_generate_waits_for_a_suspended_stream(llm):
    alone = _tokens(llm.generate(PROMPTS[2:3], PARAMS[2], use_tqdm=False))
    streamed_alone = _streamed(llm.stream(PROMPTS[:2], PARAMS[:2]))
    stream = llm.stream(PROMPTS[:2], PARAMS[:2])
    chunks = [next(stream)]
    result = {}
    other = threading.Thread(target=lambda: result.update(
        out=_tokens(llm.generate(PROMPTS[2:3], PARAMS[2], use_tqdm=False))))
    other.start()
    other.join(0.5)  # not a timing assertion: only lets the other thread reach the lock
    chunks.extend(stream)  # the stream runs on, undisturbed
    other.join(120)
    assert _streamed(chunks) == streamed_alone
    assert result["out"] == alone

"""The streaming hot path: a prebuilt chunk is byte for byte the chunk dict's JSON, and a request's
RequestOutputCollector merges what its caller has not taken yet and wakes the caller only when it waits."""

from __future__ import annotations

import asyncio
import json
import random
import threading

from minirunner.entrypoints.openai.sse import ChunkHead, sse
from minirunner.entrypoints.output_collector import DeltaOutput, RequestOutputCollector, wake

TEXTS = ["", " the", "\n", 'a "quoted" \\ back', "naïve café — 日本語 🙂", "\x00\x1f\u2028", "</s>"]


def test_prebuilt_chunks_are_the_chunk_dicts_json():
    rng = random.Random(0)
    for usage_tail, usage in (("", {}), (', "usage": null', {"usage": None})):
        head = {"id": "cmpl-" + "ab12" * 8, "object": "text_completion", "created": 1796453693,
                "model": 'shake"speare'}
        fast = ChunkHead(head, usage_tail)
        for _ in range(200):
            text = "".join(rng.choice(TEXTS) for _ in range(rng.randrange(3)))
            index, reason = rng.randrange(300), rng.choice([None, "stop", "length"])
            stop = rng.choice([None, 7, 'st"op']) if reason == "stop" else None
            want = sse({**head, "choices": [{"index": index, "text": text, "logprobs": None,
                                             "finish_reason": reason, "stop_reason": stop}], **usage})
            assert fast.completion(index, text, reason, stop) == want
            chat_head = {**head, "object": "chat.completion.chunk"}
            want = sse({**chat_head, "choices": [{"index": index, "delta": {"content": text} if text else {},
                                                  "logprobs": None, "finish_reason": reason,
                                                  "stop_reason": stop}], **usage})
            assert ChunkHead(chat_head, usage_tail).chat(index, text, reason, stop) == want
            assert json.loads(want[6:])["choices"][0]["index"] == index


def _delta(index: int, tokens: list[int], text: str, output=None, lp=None) -> DeltaOutput:
    return DeltaOutput(index, tokens, text, output is not None, "length" if output else None, lp, output)


def test_a_slow_caller_gets_the_deltas_merged_per_completion():
    async def main():
        c = RequestOutputCollector(asyncio.get_running_loop())
        assert c.get_nowait() is None
        # nobody waits: the producer gets no future to wake, and the deltas merge per completion
        assert c.put(_delta(0, [1], "a", lp=[{1: "x"}])) is None
        assert c.put(_delta(1, [7], "z")) is None
        assert c.put(_delta(0, [2, 3], "bc", lp=[{2: "y"}, {3: "z"}])) is None
        assert c.put(_delta(1, [8], "y", output="done")) is None
        assert c.put(_delta(0, [4], "d")) is None
        first, last = await c.get()
        assert (first.index, first.token_ids, first.text, first.logprobs) == (0, [1, 2, 3, 4], "abcd",
                                                                              [{1: "x"}, {2: "y"}, {3: "z"}])
        assert (last.index, last.token_ids, last.text, last.output) == (1, [7, 8], "zy", "done")
        assert c.get_nowait() is None
        c.put_error(ValueError("engine failed"))
        try:
            c.get_nowait()
        except ValueError as e:
            assert str(e) == "engine failed"
        else:
            raise AssertionError("the error put was not raised")
    asyncio.run(main())


def test_a_waiting_caller_is_woken_from_another_thread():
    async def main():
        loop = asyncio.get_running_loop()
        c = RequestOutputCollector(loop)
        got = asyncio.ensure_future(c.get())
        await asyncio.sleep(0)  # the caller now waits

        def produce():
            waiter = c.put(_delta(0, [5], "e"))
            assert waiter is not None and c.put(_delta(0, [6], "f")) is None  # one wake-up per wait
            wake(loop, [waiter])
        thread = threading.Thread(target=produce)
        thread.start()
        (delta,) = await asyncio.wait_for(got, 60)
        thread.join()
        assert delta.token_ids in ([5], [5, 6])
        rest = c.get_nowait()
        assert [t for d in [delta, *(rest or [])] for t in d.token_ids] == [5, 6]
    asyncio.run(main())

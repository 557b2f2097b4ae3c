"""AsyncLLM: concurrent callers share one engine; each gets exactly what LLM.generate returns, refused
requests and aborts touch only their own caller, and shutdown ends the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from minirunner.entrypoints.async_llm import AsyncLLM, EngineDeadError
from minirunner.llm import LLM
from minirunner.sampling_params import SamplingParams

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "HAMLET:\nTo be, or not", "First Citizen:", "KING:", "Nurse:"]


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=8, num_threads=1)


@pytest.fixture(scope="module")
def async_llm():
    engine = AsyncLLM.from_llm_kwargs(max_num_seqs=8, num_threads=1)
    yield engine
    engine.shutdown()


def _params(i: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24 + 3 * i, seed=100 + i, **kw)


async def _collect(engine: AsyncLLM, prompt, params):
    deltas = [d async for d in engine.generate(prompt, params)]
    return deltas, deltas[-1].output


def test_concurrent_seeded_requests_equal_offline_generate(llm, async_llm):
    params = [_params(i, n=1 + i % 2) for i in range(len(PROMPTS))]
    offline = llm.generate(PROMPTS, params, use_tqdm=False)

    async def run_all():
        pairs = zip(PROMPTS, params, strict=True)
        return await asyncio.gather(*[_collect(async_llm, p, sp) for p, sp in pairs])

    for (deltas, out), ref in zip(asyncio.run(run_all()), offline, strict=True):
        assert [c.token_ids for c in out.outputs] == [c.token_ids for c in ref.outputs]
        assert [c.text for c in out.outputs] == [c.text for c in ref.outputs]
        assert [c.finish_reason for c in out.outputs] == [c.finish_reason for c in ref.outputs]
        for c in ref.outputs:  # the deltas of each completion concatenate to its final text and tokens
            mine = [d for d in deltas if d.index == c.index]
            assert "".join(d.text for d in mine) == c.text
            assert [t for d in mine for t in d.token_ids] == c.token_ids


def test_requests_from_threads_and_a_refused_one(llm, async_llm):
    """Each thread runs its own event loop; a refused prompt raises ValueError in its caller only."""
    results: dict[int, object] = {}

    def worker(i: int) -> None:
        try:
            results[i] = asyncio.run(_collect(async_llm, PROMPTS[i] if i else "", _params(i)))[1]
        except ValueError as e:
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert isinstance(results[0], ValueError) and "empty" in str(results[0])
    offline = llm.generate(PROMPTS[1:4], [_params(i) for i in range(1, 4)], use_tqdm=False)
    assert [results[i].outputs[0].token_ids for i in range(1, 4)] == [o.outputs[0].token_ids for o in offline]


def test_leaving_a_stream_early_aborts_it_and_frees_its_blocks(async_llm):
    engine = async_llm.engine

    async def leave_early():
        params = SamplingParams(max_tokens=200, ignore_eos=True, seed=1)
        async for d in async_llm.generate("ROMEO:", params, request_id="leaver"):
            if len(d.token_ids) and engine.block_pool.num_used_blocks > 0:
                break
        for _ in range(200):  # the abort is applied at the next step boundary
            if "leaver" not in engine.groups:
                break
            await asyncio.sleep(0.05)

    asyncio.run(leave_early())
    assert "leaver" not in engine.groups
    # it stopped running long before its 200 tokens: only the steps before the abort ran it
    assert 0 < sum("leaver" in t.request_ids for t in engine.trace) < 50
    assert engine.block_pool.num_used_blocks == 0
    assert not engine.has_unfinished_requests()


def test_shutdown_fails_waiting_callers_and_refuses_new_ones():
    engine = AsyncLLM.from_llm_kwargs(max_num_seqs=4, num_threads=1)

    async def run():
        gen = engine.generate("ROMEO:", SamplingParams(max_tokens=200, ignore_eos=True, seed=3))
        first = await gen.__anext__()
        threading.Thread(target=engine.shutdown).start()
        with pytest.raises(EngineDeadError):
            async for _ in gen:
                pass
        return first

    assert asyncio.run(run()).token_ids
    assert not engine.is_running
    with pytest.raises(EngineDeadError):
        asyncio.run(_collect(engine, "ROMEO:", SamplingParams(max_tokens=4)))

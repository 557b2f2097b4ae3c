"""AsyncLLM: one LLMEngine shared by many concurrent callers (vLLM's name), for the OpenAI server.

Owns the engine loop: one background thread alone calls the engine (add_request / abort / step) and hands
out token ids; callers submit from any coroutine or thread and get each request's outputs, as produced,
through its RequestOutputCollector (output_collector.py: deltas a slow caller has not taken yet are
merged). Text stays off the engine thread: prompts are tokenised and validated before they reach it, in
the TokenizerPool's threads, and outputs are detokenised and checked for stop strings after it, in the
OutputHandler's thread (output_handler.py), which tells the engine when a stop string ends a request.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator

from minirunner.engine.engine import LLMEngine
from minirunner.entrypoints.output_collector import DeltaOutput, RequestOutputCollector
from minirunner.entrypoints.output_handler import OutputHandler, StepRecord
from minirunner.entrypoints.tokenizer_pool import TokenizerPool
from minirunner.llm import LLM
from minirunner.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (shutdown); no request can be served."""


class AsyncLLM:
    """Drive one LLMEngine from a background thread. ``generate`` is an async iterator of DeltaOutput
    per request; leaving it early (or cancelling it) aborts the request, which frees its KV blocks at the
    next step boundary. A request the engine refuses raises ValueError in its caller; an error in a step
    reaches the callers of the requests that step aborted, and the loop keeps serving the others."""

    def __init__(self, llm: LLM):
        self.llm = llm
        self.engine: LLMEngine = llm.engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        # touched by the engine thread only: each live request's logprobs handed out, per completion
        self._live: dict[str, dict[int, int]] = {}
        self._stopping = False
        self.tokenizers = TokenizerPool(self.engine.input_processor)
        self.engine.detokenize = False  # text and stop strings are the output thread's
        tokenizer = self.engine.tokenizer
        self.outputs = OutputHandler(None if tokenizer is None else copy.deepcopy(tokenizer),
                                     self._stopped_by_string)
        self._thread = threading.Thread(target=self._run, name="minirunner-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_llm_kwargs(cls, **llm_kwargs) -> AsyncLLM:
        """Build the engine as ``LLM(**llm_kwargs)`` does, and start its loop."""
        return cls(LLM(**llm_kwargs))

    # -- the caller's side ------------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def get_tokenizer(self):
        return self.llm.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        return self.llm.get_default_sampling_params()

    async def generate(self, prompt, params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[DeltaOutput]:
        """Queue one request (a prompt in any of vLLM's forms) and yield its outputs as the engine
        produces them; the last one has ``output`` set. Raises ValueError for a refused request."""
        async for deltas in self.generate_batches(prompt, params, request_id):
            for delta in deltas:
                yield delta

    async def generate_batches(self, prompt, params: SamplingParams,
                               request_id: str | None = None) -> AsyncIterator[list[DeltaOutput]]:
        """As ``generate``, but yields everything produced since the caller last resumed: at most one
        delta per completion, several steps' tokens merged when the caller was slower than the engine
        (so a caller writing one chunk per batch writes fewer, larger chunks under load)."""
        request_id = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        collector = RequestOutputCollector(loop)
        added: asyncio.Future = loop.create_future()
        self._send(("add", request_id, prompt, params, collector, added))
        finished = False
        try:
            try:
                await added  # raises the engine's ValueError for a refused request
            except Exception:
                finished = True
                raise
            while not finished:
                try:
                    deltas = collector.get_nowait() or await collector.get()
                except Exception:  # the engine's error for this request (a cancellation is not)
                    finished = True
                    raise
                finished = deltas[-1].output is not None
                yield deltas
        finally:
            if not finished and self.is_running:  # the caller left early or was cancelled
                self.abort(request_id)

    async def process_inputs(self, prompts: list, params: list[SamplingParams]) -> list:
        """Tokenise and validate prompts in the tokenizer pool (never the engine thread), queueing
        nothing; ProcessedPrompts in order, or ValueError naming the first refused one."""
        return await self.tokenizers.process(prompts, params)

    async def call(self, fn):
        """Run ``fn()`` in the engine thread between two steps; its result, or what it raised."""
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._send(("call", fn, done))
        return await done

    def get_metrics(self, model_name: str | None = None) -> list:
        """The engine's metric records now (minirunner/metrics/reader.py; safe from any thread), labelled
        with ``model_name`` (the served name) when given."""
        metrics = self.engine.get_metrics()
        if model_name is not None:
            for m in metrics:
                m.labels = {**m.labels, "model_name": model_name}
        return metrics

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; its blocks are freed at the next step boundary."""
        self._send(("abort", request_id))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort every request still running (their callers get EngineDeadError), stop the loop and
        close the engine."""
        if self._thread.is_alive():
            self._send(("stop",))
            self._thread.join(timeout)
        self.outputs.shutdown(timeout)
        self.tokenizers.shutdown()
        self.llm.close()

    def _send(self, command: tuple) -> None:
        if self._stopping or not self._thread.is_alive():
            raise EngineDeadError("the engine loop has stopped; no request can be served")
        self._commands.put(command)
        self._wake.set()

    def _stopped_by_string(self, request_id: str, stop_string: str, num_output_tokens: int) -> None:
        """The output thread found a stop string: the engine finishes that completion at its next step
        boundary."""
        try:
            self._send(("stop_string", request_id, stop_string, num_output_tokens))
        except EngineDeadError:
            pass

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.clear()
            if not self._apply_commands():
                break
            if self.engine.has_unfinished_requests():
                self._step()
            else:
                self._wake.wait()
        self._stopping = True
        self._fail(list(self._live), EngineDeadError("the server is shutting down; the request "
                                                        "was aborted"))
        while not self._commands.empty():  # requests that raced the stop
            command = self._commands.get()
            if command[0] in ("add", "call"):
                _set_result(command[-1], EngineDeadError("the server is shutting down"))

    def _apply_commands(self) -> bool:
        """Queue the new requests and apply the aborts; False once asked to stop."""
        while not self._commands.empty():
            command = self._commands.get()
            if command[0] == "stop":
                return False
            if command[0] == "call":
                _, fn, done = command
                try:
                    result = fn()
                except Exception as e:
                    _set_result(done, e)
                else:
                    _set_result(done, None, value=result)
                continue
            if command[0] == "abort":
                rid = command[1]
                if rid in self._live:
                    self.engine.abort_all([rid])
                    del self._live[rid]
                self.outputs.forget(rid)
                continue
            if command[0] == "stop_string":
                _, child, stop_string, num_output_tokens = command
                group_id = finish_by_stop_string(self.engine, child, stop_string, num_output_tokens)
                if group_id in self._live and self.engine.group_finished(group_id):
                    self.engine.pop_finished(group_id)  # forgotten: the output thread made its output
                    del self._live[group_id]
                continue
            _, rid, prompt, params, collector, added = command
            try:
                self.engine.add_request(prompt, params, request_id=rid)
            except Exception as e:  # a refused request: only its caller hears of it
                _set_result(added, e, collector.loop)
                continue
            self._live[rid] = {}
            self.outputs.add(rid, collector, self.engine.groups[rid])
            _set_result(added, None, collector.loop)
        return True

    def _step(self) -> None:
        engine = self.engine
        try:
            produced = engine.step()
        except Exception as e:
            # the step aborted the requests it was to run: their callers get the error
            failed = [rid for rid in self._live if engine.group_finished(rid)]
            if not failed:  # nothing was attributed to a request: fail them all, never spin
                failed = list(self._live)
            logger.exception("engine step failed; aborting %d request(s)", len(failed))
            self._fail(failed, e)
            return
        records = []
        for request, new_tokens in produced:
            sent = self._live.get(request.group_id)
            if sent is None:
                continue
            logprobs = None
            if request.logprobs is not None:
                logprobs = request.logprobs[sent.get(request.index, 0):]
                sent[request.index] = len(request.logprobs)
            records.append(StepRecord(request.group_id, request.index, new_tokens, request.is_finished,
                                      request.finish_reason, request.stop_reason, logprobs))
        for gid in {r.group_id for r in records if r.finished}:
            if engine.group_finished(gid):
                engine.pop_finished(gid)  # forgotten: the output thread makes its output
                del self._live[gid]
        if records:
            self.outputs.publish(records)

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        self.engine.abort_all(request_ids)
        for rid in request_ids:
            self._live.pop(rid, None)
        self.outputs.fail(request_ids, error)


def finish_by_stop_string(engine: LLMEngine, request_id: str, stop_string: str,
                          num_output_tokens: int) -> str | None:
    """Finish one completion in which the output thread found ``stop_string`` after its first
    ``num_output_tokens`` tokens, as the engine's own stop check would have: reason "stop", the tokens
    it produced since dropped (and taken back from the token count), its blocks freed. Returns its group's
    id (None if it is gone already)."""
    request = engine.requests.get(request_id)
    if request is None:
        return None
    if not request.is_finished:
        dropped = max(0, len(request.output_token_ids) - num_output_tokens)
        del request.output_token_ids[num_output_tokens:]
        engine.free_request(request)
        request.finish("stop", stop_string)
        engine.metrics.record_finished(request, dropped)
        engine.metrics.record_state(engine.scheduler, engine.block_pool)
    return request.group_id


def _set_result(future: asyncio.Future, error: BaseException | None,
                loop: asyncio.AbstractEventLoop | None = None, value=None) -> None:
    """Resolve a caller's future from the engine thread (with ``value``, or raising ``error``)."""
    def apply():
        if future.done():  # the caller was cancelled while waiting
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
    try:
        (loop or future.get_loop()).call_soon_threadsafe(apply)
    except RuntimeError:
        pass

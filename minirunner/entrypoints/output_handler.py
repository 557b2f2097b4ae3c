"""OutputHandler: the server's detokenization and stop strings, in their own thread (vLLM's output processor).

Owns turning the token ids the engine thread hands out into what each caller reads: per completion, the
incremental detokenizer (engine/detokenizer.py, with its own tokenizer copy), the stop-string check, the
text deltas and logprobs, and each request's final RequestOutput. The engine thread only schedules, runs
and hands over one list of records per step; this thread applies them, fills the callers'
RequestOutputCollectors and wakes their event loops. A stop string found here ends the completion at
once (the tokens the engine produced after it are dropped, never reported) and tells the engine, which
finishes the request with reason "stop" at its next step boundary, as if it had found the string itself.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from minirunner.engine.detokenizer import IncrementalDetokenizer
from minirunner.entrypoints.output_collector import DeltaOutput, RequestOutputCollector, wake
from minirunner.outputs import CompletionOutput, RequestOutput, group_metrics

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class StepRecord:
    """What one step did to one completion, as the engine thread saw it: its new tokens, whether the
    engine finished it (EOS, a stop token id, the length, an abort) and the new tokens' logprobs."""

    group_id: str
    index: int
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stop_reason: str | int | None
    logprobs: list | None


@dataclass(eq=False)
class _Completion:
    """One completion as its caller sees it: the tokens, logprobs and text reported so far."""

    request: object  # the engine's Request (its id, params and timings; read, never changed, here)
    detok: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    finish_time: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class _Stream:
    collector: RequestOutputCollector
    completions: list[_Completion]


class OutputHandler:
    """One thread. ``add``, ``forget``, ``publish`` and ``fail`` may be called from any thread (the engine
    thread calls them in the order things happened, so a request's records never overtake its ``add``);
    ``stop_request(request_id, stop_string, num_output_tokens)`` is called here when a stop string ends a
    completion, to tell the engine."""

    def __init__(self, tokenizer, stop_request):
        self.tokenizer = tokenizer  # this thread's own copy: one fast tokenizer serves one thread
        self.stop_request = stop_request
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # touched by this thread only
        self._thread = threading.Thread(target=self._run, name="minirunner-output", daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------------------------------
    def add(self, group_id: str, collector: RequestOutputCollector, group: list) -> None:
        """A request the engine queued (``group``: its n completions' Requests)."""
        self._inbox.put(("add", group_id, collector, group))

    def forget(self, group_id: str) -> None:
        """Its caller left: drop what is pending for it."""
        self._inbox.put(("forget", group_id))

    def publish(self, records: list[StepRecord]) -> None:
        """One step's records, in the order the engine produced them."""
        self._inbox.put(("step", records))

    def fail(self, group_ids: list[str], error: BaseException) -> None:
        """These requests' callers get ``error`` (after what was published for them before)."""
        self._inbox.put(("fail", group_ids, error))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Apply everything sent so far, then end the thread."""
        self._inbox.put(("stop",))
        self._thread.join(timeout)

    # -- this thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            messages = [self._inbox.get()]
            while not self._inbox.empty():  # every step the engine finished meanwhile, at once
                messages.append(self._inbox.get())
            waiting: dict = {}  # one wake-up per caller loop per batch of messages
            stopping = False
            for message in messages:
                try:
                    stopping = self._apply(message, waiting) or stopping
                except Exception:  # never lose the thread: the callers of that message would hang
                    logger.exception("output handler failed on %r", message[0])
            for loop, waiters in waiting.items():
                wake(loop, waiters)
            if stopping:
                return

    def _apply(self, message: tuple, waiting: dict) -> bool:
        kind = message[0]
        if kind == "step":
            for record in message[1]:
                self._apply_record(record, waiting)
        elif kind == "add":
            _, gid, collector, group = message
            self._streams[gid] = _Stream(collector, [self._completion(r) for r in group])
        elif kind == "forget":
            self._streams.pop(message[1], None)
        elif kind == "fail":
            _, gids, error = message
            for gid in gids:
                stream = self._streams.pop(gid, None)
                if stream is not None:
                    _add_waiter(waiting, stream.collector, stream.collector.put_error(error))
        return kind == "stop"

    def _completion(self, request) -> _Completion:
        params = request.params
        detok = None
        if self.tokenizer is not None and params.detokenize:
            detok = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens, params.stop,
                                           params.include_stop_str_in_output, params.min_tokens,
                                           request.prompt_token_ids)
        logprobs = [] if params.logprobs is not None else None
        return _Completion(request, detok, logprobs=logprobs,
                           cumulative_logprob=None if logprobs is None else 0.0)

    def _apply_record(self, record: StepRecord, waiting: dict) -> None:
        stream = self._streams.get(record.group_id)
        if stream is None:  # its caller left, or a stop string ended it here already
            return
        c = stream.completions[record.index]
        if c.finished:  # tokens the engine produced after a stop string: never reported
            return
        kept, stop_string = self._append(c, record)
        logprobs = record.logprobs
        if logprobs is not None and c.logprobs is not None:
            if len(kept) < len(record.token_ids) and len(logprobs) == len(record.token_ids):
                logprobs = logprobs[:len(kept)]  # the tokens after a stop string are dropped
            for d in logprobs:  # the sampled token comes first in its dict (logprobs.as_dicts)
                c.cumulative_logprob += next(iter(d.values())).logprob
            c.logprobs += logprobs
        if stop_string is not None:
            c.finish_reason, c.stop_reason, c.finish_time = "stop", stop_string, time.perf_counter()
            c.detok.finish(stopped_by_string=True)
            self.stop_request(c.request.request_id, stop_string, len(c.token_ids))
        elif record.finished:
            c.finish_reason, c.stop_reason = record.finish_reason, record.stop_reason
            c.finish_time = c.request.finish_time or time.perf_counter()
            if c.detok is not None:
                c.detok.finish()
        output = None
        if all(x.finished for x in stream.completions):
            output = self._output(record.group_id, stream.completions)
            del self._streams[record.group_id]
        delta = DeltaOutput(record.index, kept, c.detok.take_delta() if c.detok is not None else "",
                            c.finished, c.finish_reason, logprobs, output, c.stop_reason)
        _add_waiter(waiting, stream.collector, stream.collector.put(delta))

    @staticmethod
    def _append(c: _Completion, record: StepRecord) -> tuple[list[int], str | None]:
        """Append the record's tokens with the stop-string check, token by token as the engine's
        ``check_stop`` does: the token that ended a request by EOS or a stop token id adds no text
        (unless include_stop_str_in_output); a stop string ends the completion at the token that
        completed it. Returns (tokens kept, the stop string found or None)."""
        detok, tokens = c.detok, record.token_ids
        last = len(tokens) - 1
        for j, token in enumerate(tokens):
            c.token_ids.append(token)
            if detok is None:
                continue
            if j == last and record.finish_reason == "stop" and not isinstance(record.stop_reason, str):
                if c.request.params.include_stop_str_in_output:
                    detok.append(token)
                continue
            stop_string = detok.append(token)
            if stop_string is not None:
                return tokens[:j + 1], stop_string
        return tokens, None

    @staticmethod
    def _output(group_id: str, completions: list[_Completion]) -> RequestOutput:
        """The request's RequestOutput, as ``outputs.build_request_output`` makes it offline."""
        first = completions[0].request
        outs = [CompletionOutput(c.request.index, c.detok.output_text if c.detok is not None else "",
                                 c.token_ids, c.finish_reason, c.stop_reason, c.logprobs,
                                 c.cumulative_logprob) for c in completions]
        return RequestOutput(request_id=group_id, prompt=first.prompt,
                             prompt_token_ids=list(first.prompt_token_ids), outputs=outs, finished=True,
                             metrics=group_metrics([c.request for c in completions],
                                                   [c.finish_time for c in completions]),
                             prompt_logprobs=first.prompt_logprobs,
                             num_cached_tokens=first.num_cached_tokens)


def _add_waiter(waiting: dict, collector: RequestOutputCollector, waiter) -> None:
    if waiter is not None:
        waiting.setdefault(collector.loop, []).append(waiter)

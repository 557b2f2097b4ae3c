"""RequestOutputCollector (vLLM's name): one request's outputs, handed from the engine thread to its caller.

Owns the hand-over between the thread that produces a request's deltas and the coroutine that reads them:
the engine puts, the caller takes everything put since its last take. A caller slower than the engine gets
the deltas merged (per completion: tokens, text and logprobs concatenated), so it wakes once per batch of
tokens, never once per token; and the engine wakes the caller's event loop only when the caller waits.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from minirunner.outputs import RequestOutput


@dataclass
class DeltaOutput:
    """What one completion of a request produced since the caller last took its outputs. ``logprobs``:
    the new tokens' {token id: Logprob} dicts when the request asked for logprobs. ``output``: the whole
    RequestOutput, set on the delta that finishes the request's last completion."""

    index: int  # which of the request's n completions
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    logprobs: list | None = None
    output: RequestOutput | None = field(default=None, repr=False)
    stop_reason: str | int | None = None  # the stop string or token id that ended it (vLLM's)

    def merge(self, later: DeltaOutput) -> None:
        """Append ``later`` (the same completion's next delta) to this one."""
        self.token_ids += later.token_ids
        self.text += later.text
        self.finished, self.finish_reason = later.finished, later.finish_reason
        self.stop_reason = later.stop_reason
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        if later.output is not None:
            self.output = later.output


class RequestOutputCollector:
    """One request's pending deltas (at most one per completion, merged) or its error.

    ``put`` and ``put_error`` run in the producing thread and return the caller's waiting future, if
    the caller waits, for ``wake`` (so a producer serving many requests wakes each event loop once);
    ``get`` runs in the caller's event loop."""

    __slots__ = ("loop", "_lock", "_pending", "_error", "_waiter", "sent_logprobs")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: dict[int, DeltaOutput] = {}
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self.sent_logprobs: dict[int, int] = {}  # per completion: logprobs delivered (producer's side)

    def put(self, delta: DeltaOutput) -> asyncio.Future | None:
        with self._lock:
            pending = self._pending.get(delta.index)
            if pending is None:
                self._pending[delta.index] = delta
            else:
                pending.merge(delta)
            waiter, self._waiter = self._waiter, None
        return waiter

    def put_error(self, error: BaseException) -> asyncio.Future | None:
        with self._lock:
            self._error = error
            waiter, self._waiter = self._waiter, None
        return waiter

    def get_nowait(self) -> list[DeltaOutput] | None:
        """Everything put since the last take (the delta carrying ``output`` last), or None if nothing
        was; raises the error put, once nothing else is pending."""
        with self._lock:
            return self._take()

    async def get(self) -> list[DeltaOutput]:
        """Wait until something was put, then take it all (see get_nowait)."""
        while True:
            with self._lock:
                taken = self._take()
                if taken is not None:
                    return taken
                waiter = self._waiter = self.loop.create_future()
            await waiter

    def _take(self) -> list[DeltaOutput] | None:
        if self._pending:
            deltas = list(self._pending.values())
            self._pending = {}
            if len(deltas) > 1:  # the finishing delta last, as the engine produced it
                deltas.sort(key=lambda d: d.output is not None)
            return deltas
        if self._error is not None:
            raise self._error
        return None


def wake(loop: asyncio.AbstractEventLoop, waiters: list[asyncio.Future]) -> None:
    """Resolve the waiting callers' futures of one event loop: one wake-up of that loop for them all."""
    if not waiters:
        return
    try:
        loop.call_soon_threadsafe(_resolve, waiters)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass


def _resolve(waiters: list[asyncio.Future]) -> None:
    for w in waiters:
        if not w.done():  # a caller cancelled while waiting
            w.set_result(None)

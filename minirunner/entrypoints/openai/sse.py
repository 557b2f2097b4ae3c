"""Server-Sent Events for the streaming endpoints: framing, the per-token chunk fast path, and the response.

Owns the bytes of a streamed chunk. A chunk's constant part (id, object, created, model) is serialised once
per request (``ChunkHead``), and a plain text chunk is written from it with one ``json.dumps`` of the new
text, byte for byte what ``json.dumps`` of the whole chunk dict gives (tests/test_serve_sse.py). Also
``SSEResponse``: a streaming response that writes each event as it comes and cancels the stream (which
aborts its engine requests) when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.responses import Response


def sse(data: dict | str) -> str:
    """One Server-Sent Event: ``data: <json>`` and a blank line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


_dumps = json.dumps


class ChunkHead:
    """One streamed request's constant chunk head, serialised once. ``usage_tail``: what follows the
    choices (``, "usage": null`` when the client asked for usage in a final chunk, else nothing)."""

    __slots__ = ("prefix", "usage_tail")

    def __init__(self, head: dict, usage_tail: str = ""):
        # json.dumps({**head, "choices": [{"index": ...}]}) begins with this, for any head dict
        self.prefix = "data: " + _dumps(head)[:-1] + ', "choices": [{"index": '
        self.usage_tail = usage_tail

    def completion(self, index: int, text: str, finish_reason: str | None,
                   stop_reason: str | int | None = None) -> str:
        """sse({**head, "choices": [{"index", "text", "logprobs": None, "finish_reason", "stop_reason"}],
        ...})."""
        return (f'{self.prefix}{index}, "text": {_dumps(text)}, "logprobs": null, '
                f'{_reasons(finish_reason, stop_reason)}}}]{self.usage_tail}}}\n\n')

    def chat(self, index: int, text: str, finish_reason: str | None,
             stop_reason: str | int | None = None) -> str:
        """sse({**head, "choices": [{"index", "delta": {"content"} or {}, "logprobs": None,
        "finish_reason", "stop_reason"}], ...})."""
        delta = f'{{"content": {_dumps(text)}}}' if text else "{}"
        return (f'{self.prefix}{index}, "delta": {delta}, "logprobs": null, '
                f'{_reasons(finish_reason, stop_reason)}}}]{self.usage_tail}}}\n\n')


def _reasons(finish_reason: str | None, stop_reason: str | int | None) -> str:
    finish = "null" if finish_reason is None else _dumps(finish_reason)
    stop = "null" if stop_reason is None else _dumps(stop_reason)
    return f'"finish_reason": {finish}, "stop_reason": {stop}'



class SSEResponse(Response):
    """``text/event-stream`` from an async iterator of events (str): each event written as it comes (a
    batch of chunks joined in one string is one write). When the client disconnects, the iterator is
    cancelled and closed, which aborts its requests; uvicorn (ASGI spec 2.3) reports a disconnect only
    through ``receive``, so one watcher task per response listens for it."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str]):
        # as starlette's StreamingResponse: no body attribute, so no content-length header
        self.status_code, self.background, self.events = 200, None, events
        self.init_headers(None)

    async def __call__(self, scope, receive, send) -> None:
        stream = asyncio.ensure_future(self._stream(send, scope.get(RAW_SEND, send)))
        watch = asyncio.ensure_future(_until_disconnected(receive))
        try:
            await asyncio.wait([stream, watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not stream.done():  # the client left, or this response was cancelled
                stream.cancel()
            await asyncio.gather(stream, watch, return_exceptions=True)
        if not stream.cancelled() and stream.exception() is not None:
            raise stream.exception()

    async def _stream(self, send, body_send) -> None:
        """The start through ``send`` (every middleware sees the status and headers), the body through
        ``body_send``: the server's own send when ``with_raw_send`` left it in the scope, so each chunk
        skips the middlewares' send wrappers (none of which looks at a body; at saturation these wrappers
        were a third of the event loop's time)."""
        events = self.events
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for event in events:
                await body_send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            await body_send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()


RAW_SEND = "minirunner.raw_send"  # the scope key of the server's own send


def with_raw_send(app):
    """``app`` as an ASGI app that leaves the server's own ``send`` in each HTTP request's scope, for
    SSEResponse's body chunks."""
    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await app(scope, receive, send)
    return asgi


async def _until_disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass

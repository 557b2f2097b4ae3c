"""What stands between a hostile or slow client and the server: the HTTP-level limits and checks.

Owns the request body's reading (JSON content type, size cap, read timeout, nesting depth: each a 4xx,
never a 500), the API key check (``Bearer`` in any case, a constant-time compare), the X-Request-Id echo,
the header limits and header read timeout (a uvicorn protocol: bytes counted as they arrive), and raising
the open-file soft limit at start (vLLM's ``set_ulimit``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging

from minirunner.entrypoints.openai.protocol import APIError

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 << 20  # a request body above this is refused before it is parsed
MAX_HEADER_BYTES = 64 << 10  # the request line and headers together
MAX_HEADERS = 256


async def read_json(request, timeout: float) -> dict:
    """The body as a JSON object; APIError for a body that is not ``application/json``, too large, slower
    than ``timeout`` seconds to arrive (408), not JSON, nested too deep, or with NaN / Infinity."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise APIError(f"the request's Content-Type is {media or 'missing'!r}: send the JSON body with "
                       "'Content-Type: application/json'", param=None)
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_BODY_BYTES:
        raise APIError(f"the request body is {size} bytes; the limit is {MAX_BODY_BYTES}")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for part in request.stream():
                body += part
                if len(body) > MAX_BODY_BYTES:
                    raise APIError(f"the request body is over the limit of {MAX_BODY_BYTES} bytes")
    except TimeoutError:
        raise APIError(f"the request body did not arrive within {timeout:g} s", status=408,
                       type_="RequestTimeoutError") from None

    def refuse(name: str):
        raise ValueError(f"{name} is not a JSON number")
    try:
        value = json.loads(bytes(body), parse_constant=refuse)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError("the request body's JSON is nested too deeply") from None
    if not isinstance(value, dict):
        raise APIError("the request body must be a JSON object")
    return value


class APIKeyMiddleware:
    """401 on /v1 routes (and /tokenize, /detokenize) without ``Authorization: Bearer <key>`` (the scheme
    in any case, the key compared in constant time). A plain ASGI middleware: it adds nothing to a
    response's chunks (FastAPI's @app.middleware("http") would pass each SSE event through a stream)."""

    GUARDED = ("/v1", "/tokenize", "/detokenize")

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, api_key.encode()

    def _authorized(self, headers) -> bool:
        value = dict(headers).get(b"authorization", b"")
        scheme, _, key = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self.expected)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(self.GUARDED) and \
                not self._authorized(scope["headers"]):
            from fastapi.responses import JSONResponse

            error = APIError("missing or wrong API key: send 'Authorization: Bearer <key>'", status=401,
                             type_="AuthenticationError")
            await JSONResponse(error.body(), status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class RequestIdMiddleware:
    """Echo the request's ``X-Request-Id`` header on its response (vLLM's --enable-request-id-headers,
    always on here)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        rid = dict(scope["headers"]).get(b"x-request-id") if scope["type"] == "http" else None
        if rid is None:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid)]}
            await send(message)
        await self.app(scope, receive, send_with_id)


def request_id_base(request) -> str | None:
    """The X-Request-Id header, for the response id (vLLM's ``_base_request_id``)."""
    return request.headers.get("x-request-id") or None


def set_ulimit(target: int = 65535) -> int:
    """Raise the open-file soft limit toward ``target`` (at most the hard limit), as vLLM does at start;
    returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as e:
            logger.warning("could not raise the open-file limit from %d to %d: %s", soft, want, e)
    return soft


def guarded_http_protocol(header_timeout: float):
    """uvicorn's httptools protocol with header limits (431 over MAX_HEADER_BYTES or MAX_HEADERS) and a
    header read timeout (408, then the connection closes); None when httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _head_timer = None
        _refused = False
        _head_bytes = 0
        _head_count = 0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _refuse(self, status: bytes, message: str) -> None:
            self._refused = True
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain\r\n"
                                     b"content-length: " + str(len(message)).encode() +
                                     b"\r\nconnection: close\r\n\r\n" + message.encode())
                self.transport.close()

        def _head_timeout(self) -> None:
            self._head_timer = None
            self._refuse(b"408 Request Timeout", f"the request headers did not arrive within "
                                                 f"{header_timeout:g} s")

        def data_received(self, data: bytes) -> None:
            """Bytes of a request whose headers are not complete yet are counted as they arrive (the
            parser would buffer a header of any size before handing it over)."""
            if self._refused:
                return
            super().data_received(data)
            if self._head_timer is not None and not self._refused:
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEADER_BYTES:
                    self._refuse(b"431 Request Header Fields Too Large",
                                 f"the request headers are over {MAX_HEADER_BYTES} bytes")

        def send_400_response(self, msg: str) -> None:
            if not self._refused:
                super().send_400_response(msg)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = self._head_count = 0
            self._arm()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_count += 1
            if self._head_count > MAX_HEADERS:
                self._refuse(b"431 Request Header Fields Too Large",
                             f"the request has more than {MAX_HEADERS} headers")
                raise ValueError("too many request headers")  # stops the parser
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol

"""The OpenAI-compatible HTTP server (vLLM's ``vllm serve``): a FastAPI app over one AsyncLLM, run by uvicorn.

Owns the routes, the API key check, the body limit, turning every bad request into OpenAI's error JSON
(400, 401; never a 500 for input), aborting a request whose client went away, and a clean shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError

from minirunner.entrypoints.async_llm import AsyncLLM, EngineDeadError
from minirunner.entrypoints.openai.protocol import APIError, ChatCompletionRequest, CompletionRequest
from minirunner.entrypoints.openai.serving_chat import OpenAIServingChat
from minirunner.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minirunner.entrypoints.openai.sse import SSEResponse, sse
from minirunner.metrics.prometheus import render

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 << 20  # a request body above this is refused before it is parsed


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _validation_message(e: ValidationError | RequestValidationError) -> APIError:
    first = e.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    return APIError(f"{loc}: {first.get('msg')}" if loc else str(first.get("msg")),
                    param=loc.split(".")[0] or None)


async def _read_json(request: Request) -> dict:
    """The body as a JSON object; APIError for a body too large, not JSON, or with NaN / Infinity."""
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_BODY_BYTES:
        raise APIError(f"the request body is {size} bytes; the limit is {MAX_BODY_BYTES}")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise APIError(f"the request body is over the limit of {MAX_BODY_BYTES} bytes")

    def refuse(name: str):
        raise ValueError(f"{name} is not a JSON number")
    try:
        value = json.loads(bytes(body), parse_constant=refuse)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise APIError("the request body must be a JSON object")
    return value


async def _guard_stream(stream):
    """The SSE stream, ending with an error event and [DONE] if the engine fails mid-stream (the status
    line was sent already), as vLLM's server does."""
    try:
        async for event in stream:
            yield event
    except Exception as e:
        dead = isinstance(e, EngineDeadError)
        logger.log(logging.INFO if dead else logging.ERROR, "stream ended by an error: %s", e)
        error = APIError(str(e), status=503 if dead else 500,
                         type_="ServiceUnavailableError" if dead else "InternalServerError")
        yield sse(error.body())
        yield sse("[DONE]")


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(request: Request, work):
    """Run ``work`` (a coroutine) unless the client goes away first: then it is cancelled, which aborts
    its engine requests. Returns None when the client left."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        left = not task.done()
        if left:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if left else task.result()


class APIKeyMiddleware:
    """401 on /v1 routes without ``Authorization: Bearer <key>``. A plain ASGI middleware: it adds nothing
    to a response's chunks (FastAPI's @app.middleware("http") would pass each SSE event through a stream)."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1") and \
                dict(scope["headers"]).get(b"authorization") != self.expected:
            response = _error(APIError("missing or wrong API key: send 'Authorization: Bearer <key>'",
                                       status=401, type_="AuthenticationError"))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(engine: AsyncLLM, model_name: str, api_key: str | None = None,
              chat_template: str | None = None) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name``; its lifespan shuts the engine down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        engine.shutdown()  # every request still running is aborted; the loop stops

    app = FastAPI(title="minirunner", lifespan=lifespan)
    completion = OpenAIServingCompletion(engine, model_name)
    chat = OpenAIServingChat(engine, model_name, chat_template)

    if api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)

    @app.exception_handler(APIError)
    async def api_error(_request, e: APIError):
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, e: RequestValidationError):
        return _error(_validation_message(e))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_request, e: EngineDeadError):
        return _error(APIError(str(e), status=503, type_="ServiceUnavailableError"))

    @app.exception_handler(Exception)
    async def internal_error(_request, e: Exception):  # a bug, not bad input: logged, still OpenAI's JSON
        logger.exception("request failed")
        return _error(APIError(f"internal error: {type(e).__name__}: {e}", status=500,
                               type_="InternalServerError"))

    @app.get("/health")
    async def health():
        if not engine.is_running:
            return PlainTextResponse("engine stopped", status_code=503)
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "minirunner", "root": model_name,
                                            "max_model_len": completion.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(render(engine.get_metrics(model_name)),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def serve(request: Request, model_cls, serving):
        try:
            parsed = model_cls.model_validate(await _read_json(request))
        except ValidationError as e:
            raise _validation_message(e) from None
        processed, _ = await serving.setup(parsed)
        if parsed.stream:
            return SSEResponse(_guard_stream(serving.stream(parsed, processed)))
        body = await _unless_disconnected(request, serving.create(parsed, processed))
        if body is None:  # the client left; nobody reads this
            return PlainTextResponse("", status_code=499)
        return JSONResponse(body)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, CompletionRequest, completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, ChatCompletionRequest, chat)

    return app

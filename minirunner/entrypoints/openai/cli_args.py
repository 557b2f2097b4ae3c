"""``minirunner serve``: its command-line options and running the server until SIGINT / SIGTERM.

Owns the serve subcommand (the engine options are the ``generate`` command's, mapped to LLM(...) the same
way) and uvicorn's lifecycle: stop accepting on a signal, let in-flight requests finish for a few seconds,
abort the rest through the engine (their streams end with an error event and [DONE]), exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

SERVE_HELP = "serve the model over an OpenAI-compatible HTTP API (vLLM's `vllm serve`)"


def add_serve_parser(sub) -> argparse.ArgumentParser:
    from minirunner.cli import _engine_options

    p = sub.add_parser("serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter, help=SERVE_HELP,
                       description="Serve the model over OpenAI's API: GET /health, GET /v1/models, "
                                   "POST /v1/completions, POST /v1/chat/completions, POST /tokenize, "
                                   "POST /detokenize, GET /version, GET /metrics (Prometheus). Needs the "
                                   "serve extra: pip install 'minirunner[serve]'.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1, /tokenize and /detokenize (401 "
                        "without it); default: the MINIRUNNER_API_KEY environment variable (not shown in ps)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: --model, or 'shakespeare' for the "
                        "embedded model)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file, for a tokenizer without one")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="let requests send their own chat_template (refused with a 400 otherwise)")
    p.add_argument("--max-connections", type=int, default=1024, metavar="N",
                   help="connections served at once; a request beyond them gets a 503 (capped below the "
                        "open-file limit)")
    p.add_argument("--header-timeout", type=float, default=15.0, metavar="S",
                   help="seconds a client may take to send a request's headers (then 408, closed)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a client may take to send a request's body (then 408)")
    p.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="no access log line per request")
    p.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="S",
                   help="on SIGINT / SIGTERM, seconds in-flight requests may take to finish before they "
                        "are aborted")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    p.add_argument("--seed", type=int, default=0, help="the engine's seed (requests without a seed)")
    _engine_options(p)
    p.set_defaults(handler=run_serve)
    return p


def run_serve(args) -> int:
    try:
        import uvicorn

        from minirunner.entrypoints.async_llm import AsyncLLM
        from minirunner.entrypoints.openai.api_server import build_app
        from minirunner.entrypoints.openai.sse import with_raw_send
    except ImportError as e:
        print(f"error: serve needs the serve extra ({e}): pip install 'minirunner[serve]'", file=sys.stderr)
        return 2
    from minirunner.cli import _llm_kwargs
    from minirunner.core.gc_heap import freeze_startup_heap

    if not 0 <= args.port < 65536:
        print(f"error: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    template = None
    if args.chat_template is not None:
        try:
            with open(args.chat_template, encoding="utf-8") as f:
                template = f.read()
        except OSError as e:
            print(f"error: --chat-template: {e}", file=sys.stderr)
            return 2
    freeze_startup_heap()  # an entry point: what start-up imported, out of the collector's way
    try:
        engine = AsyncLLM.from_llm_kwargs(seed=args.seed, **_llm_kwargs(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from minirunner.entrypoints.openai.http_guard import guarded_http_protocol, set_ulimit

    name = args.served_model_name or args.model or "shakespeare"
    from minirunner import envs

    api_key = args.api_key or envs.MINIRUNNER_API_KEY
    app = build_app(engine, name, api_key, template, args.trust_request_chat_template,
                    args.body_timeout)
    open_files = set_ulimit()
    http = guarded_http_protocol(args.header_timeout) or "h11"
    config = uvicorn.Config(with_raw_send(app), host=args.host, port=args.port,
                            log_level=args.uvicorn_log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout + ABORT_GRACE_S,
                            access_log=not args.disable_uvicorn_access_log, http=http,
                            limit_concurrency=max(1, min(args.max_connections, open_files - 64)),
                            h11_max_incomplete_event_size=64 << 10)
    server = _Server(config, args.shutdown_timeout, engine)
    try:
        server.run()
    finally:
        engine.shutdown()
    return 0 if server.started else 1


ABORT_GRACE_S = 2.0  # after aborting the requests left, seconds their streams get to send the error event


class _Server:
    """uvicorn's Server, with signal handling that ends in a normal return (uvicorn re-raises the signal
    it caught after shutting down, which would end the process with the signal's status, not 0), and a
    shutdown that aborts the requests still running after ``drain`` seconds through the engine, so that
    each stream ends with an error event and [DONE] before uvicorn cancels what is left."""

    def __init__(self, config, drain: float, engine):
        import uvicorn

        class Server(uvicorn.Server):
            async def shutdown(self, sockets=None):
                async def abort_after():
                    await asyncio.sleep(drain)
                    await asyncio.to_thread(engine.shutdown)
                abort = asyncio.ensure_future(abort_after())
                try:
                    await super().shutdown(sockets)
                finally:
                    abort.cancel()

            @contextlib.contextmanager
            def capture_signals(self):
                def handle(sig, frame):
                    if self.should_exit:  # a second signal: stop waiting for in-flight requests
                        self.force_exit = True
                    self.should_exit = True
                previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
                try:
                    yield
                finally:
                    for s, h in previous.items():
                        signal.signal(s, h)

        self.server = Server(config)

    @property
    def started(self) -> bool:
        return self.server.started

    def run(self) -> None:
        self.server.run()

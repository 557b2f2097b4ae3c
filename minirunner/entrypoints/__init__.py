"""Serving entry points: AsyncLLM (one engine, many concurrent callers) and the OpenAI-compatible server.

Needs the ``serve`` extra (fastapi, uvicorn) for the server only; AsyncLLM needs nothing beyond the core.
"""

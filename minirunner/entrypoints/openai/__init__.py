"""The OpenAI-compatible HTTP server (``minirunner serve``): FastAPI app, protocol models, endpoints.

Owns the HTTP layer only; every request goes through one AsyncLLM.
"""

"""Structured output on the server: the request fields that ask for it -> one StructuredOutputsParams.

Owns the mapping from OpenAI's ``response_format`` (``json_object``, ``json_schema``), vLLM's
``structured_outputs`` object (json, regex, choice, grammar, json_object and its options) and the older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` fields, and refusing (400, with
the reason) a request that asks in more than one way or in a way not served here. Whether the schema,
regex or grammar compiles is checked when the request is processed (a 400 too).
"""

from __future__ import annotations

from dataclasses import fields

from minirunner.entrypoints.openai.protocol import APIError
from minirunner.structured_output.params import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
_OPTIONS = {f.name for f in fields(StructuredOutputsParams)}


def structured_outputs_from_request(request) -> StructuredOutputsParams | None:
    """The constraint a completion or chat request asks for (None: none); raises APIError (400)."""
    asked: list[tuple[str, dict]] = []  # (the field that asked, StructuredOutputsParams keyword arguments)
    fmt = request.response_format
    if fmt is not None and fmt != {"type": "text"}:
        kind = fmt.get("type")
        if kind == "json_object":
            asked.append(("response_format", {"json_object": True}))
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema", spec.get("json_schema")) if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise APIError("response_format {'type': 'json_schema'} needs 'json_schema': {'name': ..., "
                               "'schema': {...}} with the schema as a JSON object", param="response_format")
            asked.append(("response_format", {"json": schema}))
        else:
            raise APIError(f"response_format type {kind!r} is not supported here: use 'text', 'json_object' "
                           "or 'json_schema'", param="response_format")
    if request.structured_outputs is not None:
        unknown = sorted(set(request.structured_outputs) - _OPTIONS)
        if unknown:
            raise APIError(f"structured_outputs has unknown keys {unknown}: use json, regex, choice, grammar "
                           "or json_object (and disable_any_whitespace)", param="structured_outputs")
        asked.append(("structured_outputs", dict(request.structured_outputs)))
    for name, kind in _GUIDED.items():
        if getattr(request, name) is not None:
            asked.append((name, {kind: getattr(request, name)}))
    if not asked:
        return None
    if len(asked) > 1:
        raise APIError(f"structured output is asked for by {', '.join(n for n, _ in asked)}: use only one of "
                       "them", param=asked[1][0])
    name, kwargs = asked[0]
    try:
        return StructuredOutputsParams(**kwargs)
    except ValueError as e:
        raise APIError(f"{name}: {e}", param=name) from None

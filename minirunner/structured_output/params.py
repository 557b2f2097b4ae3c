"""StructuredOutputsParams: what a request's output must match (vLLM's ``vllm.sampling_params``
dataclass of the same name), validated on construction.

Owns the constraint's data and its checks that need no tokenizer: exactly one of ``json``, ``regex``,
``choice``, ``grammar``, ``json_object`` is set, each of the right type. Whether a schema, regex or grammar
compiles is checked when the request is added (compiler.py). It never imports xgrammar.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass

_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """One constraint: ``json`` (a JSON schema, as a dict or a JSON string), ``regex`` (the whole output
    matches it), ``choice`` (the output is one of these strings), ``grammar`` (an EBNF / GBNF grammar,
    or a Lark grammar), or ``json_object=True`` (any JSON object). ``disable_any_whitespace``: JSON
    without optional whitespace. The other fields are vLLM's, accepted at their defaults."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    disable_fallback: bool = False

    def __post_init__(self) -> None:
        given = [k for k in _KINDS if getattr(self, k) is not None]
        if len(given) > 1:  # vLLM's phrases first, so code matching on them still works
            raise ValueError(f"You can only use one kind of structured outputs constraint but multiple "
                             f"are specified: {', '.join(given)}; keep one of them")
        if not given:
            raise ValueError("You must use one kind of structured outputs constraint but none are "
                             "specified: set one of json, regex, choice, grammar or json_object")
        if self.structural_tag is not None:
            raise ValueError("structured_outputs.structural_tag is not supported here: use json, regex, "
                             "choice, grammar or json_object")
        if self.whitespace_pattern is not None:
            raise ValueError("structured_outputs.whitespace_pattern is not supported here (as with vLLM's "
                             "xgrammar backend): leave it None, or use disable_any_whitespace=True")
        if self.disable_additional_properties:
            raise ValueError("structured_outputs.disable_additional_properties is not supported here: put "
                             "\"additionalProperties\": false in the schema itself")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    _json.loads(self.json)
                except ValueError as e:
                    raise ValueError(f"structured_outputs.json is a string that is not valid JSON ({e}): "
                                     "give a JSON schema as a dict or a JSON string") from None
            elif not isinstance(self.json, dict):
                raise ValueError(f"structured_outputs.json must be a JSON schema (a dict or a JSON string), "
                                 f"got a {type(self.json).__name__}")
            else:
                try:
                    _json.dumps(self.json)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"structured_outputs.json cannot be written as JSON ({e}): give a "
                                     "schema of dicts, lists, strings, numbers, booleans and None") from None
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, (list, tuple)) or not self.choice \
                    or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, "
                                 f"got {self.choice!r}")
            self.choice = list(self.choice)
        if self.json_object is not None and self.json_object is not True:
            raise ValueError(f"structured_outputs.json_object must be True when given, got "
                             f"{self.json_object!r}: leave it None for no constraint")
        for name in ("disable_any_whitespace", "disable_fallback"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"structured_outputs.{name} must be True or False")

    @property
    def kind(self) -> str:
        """Which constraint is set: "json", "regex", "choice", "grammar" or "json_object"."""
        return next(k for k in _KINDS if getattr(self, k) is not None)

    def key(self) -> tuple:
        """(kind, spec, any whitespace): equal for constraints that compile to the same grammar. A JSON
        schema is kept as a JSON string in its own key order (the order of the properties in the
        output)."""
        kind = self.kind
        spec = getattr(self, kind)
        if kind == "json" and not isinstance(spec, str):
            spec = _json.dumps(spec)
        elif kind == "choice":
            spec = tuple(spec)
        elif kind == "json_object":
            spec = True
        return kind, spec, not self.disable_any_whitespace

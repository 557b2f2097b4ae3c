"""GrammarCompiler: a request's StructuredOutputsParams -> an xgrammar CompiledGrammar for this model's
tokenizer, cached by (kind, spec).

Owns importing xgrammar (absent: a ValueError naming the ``structured`` extra), the TokenizerInfo built
once from the Hugging Face tokenizer with the model's logits width as its vocabulary size and the engine's
EOS ids as stop tokens (so a completed grammar allows EOS), how each kind becomes a grammar (vLLM's
choices: a JSON schema, ``{"type": "object"}`` for json_object, a regex, an EBNF of the choices, an EBNF
or Lark grammar), and turning a compile error into a ValueError naming the field. It never runs a
matcher and never touches a step.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

_MAX_CACHED = 256  # compiled grammars kept (least recently used dropped first)


def import_xgrammar():
    """The xgrammar module, or a ValueError saying how to install it."""
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured output needs the xgrammar package, which is not installed: "
                         "pip install 'minirunner[structured]' (or pip install xgrammar)") from None
    return xgrammar


def _ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal (quotes, backslashes and control characters escaped)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose sentences are exactly ``choices`` (vLLM's ``choice_as_grammar``)."""
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choices)


class GrammarCompiler:
    """Compiles constraints for one model's tokenizer; safe to call from several threads."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids):
        """tokenizer: the Hugging Face tokenizer (None: structured output is refused); vocab_size: the
        width of the model's logits (may exceed the tokenizer's length); stop_token_ids: the EOS ids."""
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler = None
        self._cache: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def _xgrammar_compiler(self):
        xgr = import_xgrammar()
        if self._compiler is None:
            if self.tokenizer is None:
                raise ValueError("structured output needs the model's tokenizer, and this model directory "
                                 "has no tokenizer files: pass LLM(tokenizer=<directory>)")
            try:
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.stop_token_ids)
            except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError and others
                raise ValueError(f"xgrammar cannot read this model's tokenizer ({e}): structured output "
                                 "is not available for it") from None
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def compile(self, params):
        """The CompiledGrammar of ``params`` (a StructuredOutputsParams). Raises ValueError naming the
        field for a schema, regex or grammar xgrammar refuses."""
        key = params.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            compiler = self._xgrammar_compiler()
            kind, spec, any_whitespace = key
            try:
                if kind == "json":
                    compiled = compiler.compile_json_schema(spec, any_whitespace=any_whitespace)
                elif kind == "json_object":
                    compiled = compiler.compile_json_schema('{"type": "object"}',
                                                            any_whitespace=any_whitespace)
                elif kind == "regex":
                    compiled = compiler.compile_regex(spec)
                elif kind == "choice":
                    compiled = compiler.compile_grammar(choice_grammar(list(spec)))
                elif "::=" in spec:
                    compiled = compiler.compile_grammar(spec)
                else:  # vLLM also takes Lark grammars ("start: ..." rules)
                    compiled = compiler.compile_lark(spec)
            except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError for a bad spec
                what = {"json": "JSON schema", "regex": "regular expression", "choice": "list of choices",
                        "grammar": "EBNF or Lark grammar", "json_object": "JSON object grammar"}[kind]
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                first = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", first)  # xgrammar's time and C++ source
                raise ValueError(f"structured_outputs.{kind} is not a valid {what} for xgrammar: "
                                 f"{first}") from None
            self._cache[key] = compiled
            if len(self._cache) > _MAX_CACHED:
                self._cache.popitem(last=False)
            return compiled

"""One validation pass over a checkpoint's config.json, before any number of it is used.

Owns the types and ranges of the fields ``ModelConfig.from_dict`` reads: a missing required field, a
wrong type (a string, a bool, a list for a number), a size of zero or below, heads that do not divide
the hidden size, a non-finite or non-positive float each raise ValueError naming the file and the field.
"""

from __future__ import annotations

import math

_REQUIRED_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads")
_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window")
_POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta")
_BOOLS = ("tie_word_embeddings", "attention_bias", "use_sliding_window")
_LLAMA3_FLOATS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class _Checker:
    def __init__(self, where: str):
        self.where = where

    def fail(self, field: str, what: str, value) -> None:
        raise ValueError(f"{self.where}: field {field!r} {what}, got {value!r}; fix config.json "
                         "(does it belong to this checkpoint?)")

    def size(self, cfg: dict, field: str, required: bool) -> None:
        if field not in cfg or (cfg[field] is None and not required):
            if required:
                raise ValueError(f"{self.where}: required field {field!r} is missing; fix config.json")
            return
        value = cfg[field]
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, "must be an integer", value)
        if value < 1:
            self.fail(field, "must be >= 1", value)

    def positive(self, cfg: dict, field: str, name: str | None = None) -> None:
        if field not in cfg or cfg[field] is None:
            return
        value = cfg[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value <= 0:
            self.fail(name or field, "must be a finite number > 0", value)


def check_config_dict(cfg, where: str = "config.json") -> None:
    """Raise ValueError naming ``where`` (the file) and the field for any malformed field of ``cfg``."""
    c = _Checker(where)
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: must hold a JSON object ({{...}}), got a {type(cfg).__name__}; "
                         "fix config.json")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        c.fail("architectures", "must be a list of class names", archs)
    for field in _REQUIRED_SIZES:
        c.size(cfg, field, required=True)
    for field in _OPTIONAL_SIZES:
        c.size(cfg, field, required=False)
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if heads % kv_heads:
        c.fail("num_key_value_heads", f"must divide num_attention_heads={heads}", kv_heads)
    if not cfg.get("head_dim") and cfg["hidden_size"] % heads:
        c.fail("num_attention_heads", f"must divide hidden_size={cfg['hidden_size']} (or set head_dim)",
               heads)
    for field in _POSITIVE_FLOATS:
        c.positive(cfg, field)
    for field in _BOOLS:
        if cfg.get(field) is not None and not isinstance(cfg[field], bool):
            c.fail(field, "must be true or false", cfg[field])
    for key in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            c.fail(key, "must be an object or null", rope)
        c.positive(rope, "rope_theta", f"{key}.rope_theta")
        if rope.get("rope_type", rope.get("type")) == "llama3":
            for field in _LLAMA3_FLOATS:
                if field not in rope:
                    raise ValueError(f"{where}: field '{key}.{field}' is missing (llama3 RoPE needs it); "
                                     "fix config.json")
                c.positive(rope, field, f"{key}.{field}")
    eos = cfg.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        c.fail("eos_token_id", "must be a token id (an integer >= 0) or a list of them", eos)
    for field in ("dtype", "torch_dtype", "hidden_act", "model_type"):
        if cfg.get(field) is not None and not isinstance(cfg[field], str):
            c.fail(field, "must be a string", cfg[field])
    layer_types = cfg.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list)
                                        and all(isinstance(t, str) for t in layer_types)):
        c.fail("layer_types", "must be a list of strings", layer_types)
    factor = cfg.get("partial_rotary_factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))):
        c.fail("partial_rotary_factor", "must be a number", factor)

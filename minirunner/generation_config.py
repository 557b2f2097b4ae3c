"""The model's ``generation_config.json``: its EOS ids and the sampling defaults it was published with.

Owns reading that file once and turning it into what the engine needs: extra EOS token ids, and the
fields vLLM takes from it as default sampling parameters (vLLM's ``ModelConfig.get_diff_sampling_param``:
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_new_tokens``, the last
as ``max_tokens``). A missing file means "no defaults"; a file that is not a JSON object (unreadable,
not UTF-8, not JSON, a list) is ignored with a logged warning, also meaning "no defaults"; a readable
file whose field we use holds a bad value (a NaN, a string for a number, a nested list of EOS ids)
raises ValueError naming the file and the field: a default the publisher set is never silently dropped.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

logger = logging.getLogger(__name__)

# field -> (kind, lowest, highest, lowest included): the values SamplingParams would take
_RANGES = {
    "temperature": ("float", 0.0, None, True),
    "top_p": ("float", 0.0, 1.0, False),
    "min_p": ("float", 0.0, 1.0, True),
    "repetition_penalty": ("float", 0.0, None, False),
    "top_k": ("int", -1, None, True),
    "max_new_tokens": ("int", 1, None, True),
}

# generation_config.json field -> SamplingParams field (vLLM's list of the fields it honours)
SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def read_generation_config(model_dir: str | Path) -> dict:
    """The file's contents as a dict: {} when the directory has none, or (with a warning) when it is not a
    JSON object. The readers below check the fields they use."""
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return {}
    try:
        if not path.is_file():  # a FIFO would block the read forever
            raise OSError("not a regular file")
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as e:
        logger.warning("ignoring %s: it is unreadable (%s), so the model sets no sampling defaults", path, e)
        return {}
    if not isinstance(value, dict):
        logger.warning("ignoring %s: it holds a JSON %s, not an object", path, type(value).__name__)
        return {}
    return value


def _where(model_dir: str | Path) -> str:
    return str(Path(model_dir) / "generation_config.json")


def check_sampling_fields(config: dict, where: str) -> None:
    """Raise ValueError naming ``where`` and the field when a sampling field holds a bad value."""
    for field, (kind, low, high, low_ok) in _RANGES.items():
        value = config.get(field)
        if value is None:
            continue
        number = not isinstance(value, bool) and isinstance(value, int if kind == "int" else (int, float))
        if not number or not math.isfinite(value) or value < low or (value == low and not low_ok) \
                or (high is not None and value > high):
            span = f"{'[' if low_ok else '('}{low}, {'inf)' if high is None else f'{high}]'}"
            raise ValueError(f"{where}: field {field!r} must be a finite {kind} in {span}, got {value!r}; "
                             "fix the file, or pass LLM(generation_config='vllm') to ignore it")


def generation_eos_ids(model_dir: str | Path) -> frozenset[int]:
    """The EOS token ids the generation config names (one id or a list); ValueError naming the file and
    the field for anything else (a nested list, a string, a negative id)."""
    eos = read_generation_config(model_dir).get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ValueError(f"{_where(model_dir)}: field 'eos_token_id' must be a token id (an integer >= 0) "
                         f"or a list of them, got {eos!r}; fix the file")
    return frozenset(ids)


def sampling_defaults(model_dir: str | Path) -> dict:
    """The SamplingParams keyword arguments the model's generation config sets (only those present and
    not null), e.g. ``{"temperature": 0.8, "top_p": 0.95}``."""
    config = read_generation_config(model_dir)
    check_sampling_fields(config, _where(model_dir))
    return {ours: config[theirs] for theirs, ours in SAMPLING_FIELDS.items()
            if config.get(theirs) is not None}

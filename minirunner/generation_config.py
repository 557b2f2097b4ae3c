"""The model's ``generation_config.json``: its EOS ids and the sampling defaults it was published with.

Owns reading that file once and turning it into what the engine needs: extra EOS token ids, and the
fields vLLM takes from it as default sampling parameters (vLLM's ``ModelConfig.get_diff_sampling_param``:
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_new_tokens``, the last
as ``max_tokens``). A missing or unreadable file means "no defaults", never an error.
"""

from __future__ import annotations

import json
from pathlib import Path

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
    """The file's contents as a dict ({} when the directory has none, or it is not valid JSON)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def generation_eos_ids(model_dir: str | Path) -> frozenset[int]:
    """The EOS token ids the generation config names (one id or a list)."""
    eos = read_generation_config(model_dir).get("eos_token_id")
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


def sampling_defaults(model_dir: str | Path) -> dict:
    """The SamplingParams keyword arguments the model's generation config sets (only those present and
    not null), e.g. ``{"temperature": 0.8, "top_p": 0.95}``."""
    config = read_generation_config(model_dir)
    return {ours: config[theirs] for theirs, ours in SAMPLING_FIELDS.items()
            if config.get(theirs) is not None}

"""RunnableSequence: what the KV manager and the step's data builder (engine/step_data.py) read of
anything the engine runs (a Request). The worker never sees one: it reads the data.

Owns the protocol only; an implementation declares it explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from minirunner.sampling_params import SamplingParams


class RunnableSequence(Protocol):
    """request_id; num_computed_tokens (tokens with K/V in the cache); num_output_placeholders (tokens
    a launched step may emit, not read yet); num_tokens and token_buffer (int64, valid up to num_tokens:
    the tokens known); prompt_token_ids, params, seed and eos_token_ids (sent once, when the worker gets
    a row for it); output_token_ids (tokens generated so far)."""

    # Annotations only (no properties here): a dataclass field or a property of an implementation
    # satisfies each, and nothing of the protocol's shadows a field.
    request_id: str
    num_computed_tokens: int
    num_output_placeholders: int  # tokens a launched step may emit that the host has not read yet
    num_tokens: int
    token_buffer: np.ndarray
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    seed: int
    eos_token_ids: frozenset[int]
    output_token_ids: Sequence[int]

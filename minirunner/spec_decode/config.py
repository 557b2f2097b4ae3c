"""SpeculativeConfig: parse and validate ``LLM(speculative_config={...})`` dicts in vLLM's shape.

Owns every check on the speculative settings (method, draft model, k, n-gram window, the per-batch-size
k table, the acceptance-driven mode) so that a bad setting fails at construction with a ValueError that
says what to change. Never loads weights (only the draft's config.json, to compare vocabularies).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minirunner.assets import default_draft_dir, default_model_dir
from minirunner.config import ModelConfig

METHODS = ("draft_model", "ngram")
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
         "num_speculative_tokens_per_batch_size", "dynamic_k", "cost_ratio"}


@dataclass(frozen=True)
class SpeculativeConfig:
    """method: "draft_model" or "ngram"; num_speculative_tokens: k, the most drafts per step (>= 1).
    draft_model: the draft's checkpoint directory (the embedded draft on the embedded target).
    ngram: lookup windows of prompt_lookup_min..prompt_lookup_max tokens.
    k per step (``k_for_batch_size``): the table ``num_speculative_tokens_per_batch_size``
    [[start_bs, end_bs, k], ...] (inclusive ranges; k = 0 turns speculation off at that size; sizes
    outside every range use num_speculative_tokens), or ``dynamic_k="acceptance"`` (see
    ``minirunner.spec_decode.dynamic``), with an optional fixed ``cost_ratio`` c (else measured)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] = ()
    dynamic_k: str | None = None
    cost_ratio: float | None = None

    @classmethod
    def from_dict(cls, spec: dict, target_dir: str | Path, target_config: ModelConfig,
                  max_model_len: int | None = None) -> SpeculativeConfig:
        if isinstance(spec, SpeculativeConfig):
            return spec
        if not isinstance(spec, dict):
            raise ValueError("speculative_config must be a dict such as {'method': 'ngram', "
                             "'num_speculative_tokens': 3}")
        unknown = set(spec) - _KEYS
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {sorted(unknown)}; known keys "
                             f"are {sorted(_KEYS)}")
        method = spec.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config method {method!r} is not supported; use one of "
                             f"{list(METHODS)}")
        k = spec.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r} (to turn "
                             "speculation off, leave speculative_config out, or use k = 0 in "
                             "num_speculative_tokens_per_batch_size)")
        model = spec.get("model")
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if method == "ngram":
            if model is not None:
                raise ValueError("the ngram method uses no draft model: drop 'model', or use "
                                 "method 'draft_model'")
            lo = lo if lo is not None else (hi if hi is not None else 1)
            hi = hi if hi is not None else max(lo, 3)
            for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
            if lo > hi:
                raise ValueError(f"prompt_lookup_min ({lo}) must not exceed prompt_lookup_max ({hi})")
        else:
            if lo is not None or hi is not None:
                raise ValueError("prompt_lookup_min/max belong to the ngram method, not draft_model")
            model = cls._draft_dir(model, target_dir)
            cls._check_draft(model, target_config, max_model_len)
            lo, hi = 1, 3
        table = cls._table(spec.get("num_speculative_tokens_per_batch_size"), k)
        dynamic = spec.get("dynamic_k")
        if dynamic not in (None, "acceptance"):
            raise ValueError(f"dynamic_k {dynamic!r} is not supported; use 'acceptance' or leave it out")
        if dynamic and table:
            raise ValueError("give either num_speculative_tokens_per_batch_size or dynamic_k, not both")
        c = spec.get("cost_ratio")
        if c is not None and (not isinstance(c, (int, float)) or c < 0):
            raise ValueError(f"cost_ratio must be a number >= 0 (draft step time / target step "
                             f"time), got {c!r}")
        if c is not None and not dynamic:
            raise ValueError("cost_ratio is only used with dynamic_k='acceptance'")
        return cls(method, k, None if model is None else str(model), lo, hi, table, dynamic,
                   None if c is None else float(c))

    @staticmethod
    def _draft_dir(model, target_dir) -> Path:
        if model is not None:
            return Path(model)
        if Path(target_dir).resolve() == default_model_dir().resolve():
            return default_draft_dir()
        raise ValueError("method 'draft_model' needs 'model': the draft checkpoint directory (only "
                         "the embedded target has a default draft)")

    @staticmethod
    def _check_draft(model: Path, target: ModelConfig, max_model_len: int | None) -> None:
        draft = ModelConfig.from_dir(model)
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({draft.vocab_size} tokens) differs from "
                             f"the target's ({target.vocab_size}): a draft must share the target's "
                             "tokenizer and vocabulary")
        if max_model_len is not None and draft.max_position_embeddings < max_model_len:
            raise ValueError(f"the draft model handles {draft.max_position_embeddings} positions but "
                             f"max_model_len is {max_model_len}: lower max_model_len")

    @staticmethod
    def _table(table, k_max: int) -> tuple[tuple[int, int, int], ...]:
        if table is None:
            return ()
        rows = []
        for row in table:
            if not (isinstance(row, (list, tuple)) and len(row) == 3
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in row)):
                raise ValueError(f"num_speculative_tokens_per_batch_size rows are [start_bs, end_bs, "
                                 f"k] integers, got {row!r}")
            start, end, k = row
            if not 1 <= start <= end:
                raise ValueError(f"batch-size range [{start}, {end}] must satisfy 1 <= start <= end")
            if not 0 <= k <= k_max:
                raise ValueError(f"k = {k} for batch sizes [{start}, {end}] must be in [0, "
                                 f"num_speculative_tokens={k_max}]")
            rows.append((start, end, k))
        rows.sort()
        for (_, end_a, _), (start_b, _, _) in zip(rows, rows[1:], strict=False):
            if start_b <= end_a:
                raise ValueError("num_speculative_tokens_per_batch_size ranges overlap")
        return tuple(rows)

    @property
    def max_num_speculative_tokens(self) -> int:
        """The most drafts any step may carry (sizes the graph-mode verify buffers)."""
        return max([self.num_speculative_tokens]
                   + [k for _, _, k in self.num_speculative_tokens_per_batch_size])

    def k_for_batch_size(self, batch_size: int) -> int:
        """k from the table (num_speculative_tokens outside every range)."""
        for start, end, k in self.num_speculative_tokens_per_batch_size:
            if start <= batch_size <= end:
                return k
        return self.num_speculative_tokens

"""Tokenizer loading: the checkpoint directory's own tokenizer files through transformers, offline and
without remote code. A directory without tokenizer files gives None (prompts must then be token ids)."""

from __future__ import annotations

from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_dir: str | Path):
    model_dir = Path(model_dir)
    if not any((model_dir / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True,
                                             trust_remote_code=False)
    except Exception as e:  # a broken tokenizer is a user-fixable configuration problem
        raise ValueError(f"could not load the tokenizer in {str(model_dir)!r}: {e}") from e

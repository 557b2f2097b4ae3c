"""Tokenizer loading: the checkpoint directory's own tokenizer files through transformers, offline and
without remote code. A directory without tokenizer files gives None (prompts must then be token ids).
Also the chat template: rendering a conversation to a prompt string, as vLLM's ``LLM.chat`` does."""

from __future__ import annotations

from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# vLLM's tokenizer_mode values we serve: "auto" and "hf" take the fast tokenizer when there is one.
TOKENIZER_MODES = ("auto", "hf", "slow")


def check_tokenizer_dir(tokenizer_dir: str | Path) -> None:
    """An explicit ``tokenizer=`` directory must exist and hold tokenizer files (never silently ignored)."""
    path = Path(tokenizer_dir)
    if not path.is_dir() or not any((path / f).exists() for f in _TOKENIZER_FILES):
        raise ValueError(f"tokenizer={str(tokenizer_dir)!r} is not a directory holding tokenizer files "
                         f"({', '.join(_TOKENIZER_FILES)}): pass a tokenizer directory, or leave tokenizer "
                         "unset to use the model's")


def load_tokenizer(model_dir: str | Path, tokenizer_mode: str = "auto"):
    if tokenizer_mode not in TOKENIZER_MODES:
        raise ValueError(f"tokenizer_mode={tokenizer_mode!r} is not supported here: use one of "
                         f"{TOKENIZER_MODES} ('mistral' needs mistral_common, 'custom' a plugin)")
    model_dir = Path(model_dir)
    present = [model_dir / f for f in _TOKENIZER_FILES if (model_dir / f).exists()]
    odd = [p.name for p in present if not p.is_file()]
    if odd:  # transformers would block forever reading a FIFO
        raise ValueError(f"tokenizer files {odd} in {str(model_dir)!r} are not regular files (a FIFO, a "
                         "device or a directory)")
    if not present:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True,
                                             trust_remote_code=False,
                                             use_fast=tokenizer_mode != "slow")
    except Exception as e:  # a broken tokenizer is a user-fixable configuration problem
        raise ValueError(f"could not load the tokenizer in {str(model_dir)!r}: {e}") from e


def render_chat(tokenizer, messages: list[dict], chat_template: str | None = None,
                add_generation_prompt: bool = True, **template_kwargs) -> str:
    """One conversation ([{"role": ..., "content": ...}, ...]) rendered by the tokenizer's chat
    template (or ``chat_template``), ending with the assistant's turn opened."""
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer with a chat template, and this model directory has no "
                         "tokenizer files")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template (tokenizer_config.json has no "
                         "'chat_template'), so a conversation cannot be turned into a prompt: use "
                         "generate() with plain text, or pass chat_template=...")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
    return tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)

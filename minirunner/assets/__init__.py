"""The embedded default model pair (target + draft), shipped as package data.

Owns where the bundled Hugging Face-format checkpoints live; never downloads anything.
"""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL_NAME = "shakespeare"


def default_model_dir() -> Path:
    """Directory of the embedded target model (config.json, model.safetensors, tokenizer files)."""
    return ASSETS_DIR / DEFAULT_MODEL_NAME / "target"


def default_draft_dir() -> Path:
    """Directory of the embedded draft model, which shares the target's tokenizer."""
    return ASSETS_DIR / DEFAULT_MODEL_NAME / "draft"

"""Loading a Hugging Face checkpoint directory: safetensors weights only, never a pickle.

Owns turning config.json + *.safetensors into a ``DecoderLM`` on the requested device and dtype, with a
clear error for a missing, pickled, corrupt or mismatched checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from minirunner.config import ModelConfig
from minirunner.model.decoder import DecoderLM
from minirunner.model.rope import inverse_frequencies

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _weight_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in model_dir.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickled:
        raise ValueError(f"{str(model_dir)!r} holds only pickled weights ({', '.join(pickled)}); "
                         "minirunner never unpickles a checkpoint. Convert it to safetensors, e.g. "
                         "load it in a trusted environment and save_pretrained(safe_serialization=True)")
    raise ValueError(f"{str(model_dir)!r} holds no *.safetensors weights")


def load_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype,
               device: torch.device) -> DecoderLM:
    model_dir = Path(model_dir)
    files = _weight_files(model_dir)
    with torch.device("meta"):
        model = DecoderLM(config)
    expected = dict(model.named_parameters())  # tied lm_head appears once, as embed_tokens
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name in expected or name == "lm_head.weight":
                        tensors[name] = f.get_tensor(name)
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"checkpoint file {file.name!r} is corrupt or unreadable ({e}); "
                             "re-download or re-save the model") from e
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"checkpoint in {str(model_dir)!r} lacks {len(missing)} tensors the "
                         f"config needs, e.g. {missing[:3]}; does config.json match the weights?")
    for name, param in expected.items():
        if tuple(tensors[name].shape) != tuple(param.shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensors[name].shape)} but the config "
                             f"implies {tuple(param.shape)}")
    model = model.to_empty(device=device)
    with torch.no_grad():
        params = dict(model.named_parameters(remove_duplicate=False))
        for name in expected:
            params[name].copy_(tensors[name])
    if config.tie_word_embeddings:  # to_empty() gives every parameter its own storage: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(dtype=dtype).eval()
    # RoPE frequencies stay fp32 whatever the weights' dtype (as in transformers).
    model.rotary.inv_freq = inverse_frequencies(
        config.head_dim, config.rope_theta, config.rope_scaling).to(device)
    model.fuse_projections()
    return model

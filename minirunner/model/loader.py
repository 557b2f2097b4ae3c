"""Loading a Hugging Face checkpoint directory: safetensors weights only, never a pickle.

Owns turning config.json + *.safetensors into a ``DecoderLM`` on the requested device and dtype, with a
clear error for a missing, pickled, corrupt or mismatched checkpoint. The model is built on the meta
device (no storage) and each checkpoint tensor is converted to the target dtype and device as it is read,
then assigned: no full-size float32 copy of the model ever exists, so a bf16 checkpoint loaded in bf16
peaks at about its own size plus one tensor.
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
                    if name not in expected:
                        continue  # e.g. a tied lm_head saved anyway: embed_tokens is the one
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != tuple(expected[name].shape):
                        raise ValueError(f"tensor {name!r} has shape {shape} but the config "
                                         f"implies {tuple(expected[name].shape)}")
                    # Straight to the target dtype and device, one tensor at a time.
                    tensors[name] = f.get_tensor(name).to(device=device, dtype=dtype)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"checkpoint file {file.name!r} is corrupt or unreadable ({e}); "
                             "re-download or re-save the model") from e
    return finish_loading(model, tensors, set(expected), model_dir, device)


def finish_loading(model: DecoderLM, tensors: dict[str, torch.Tensor], expected: set[str],
                   model_dir: str | Path, device) -> DecoderLM:
    """Check that every ``expected`` tensor was read, assign them, tie lm_head, freeze, set RoPE and fuse
    the projections: the end of loading a whole model or one rank's shard of it."""
    config = model.config
    missing = sorted(expected - set(tensors))
    if missing:
        raise ValueError(f"checkpoint in {str(model_dir)!r} lacks {len(missing)} tensors the "
                         f"config needs, e.g. {missing[:3]}; does config.json match the weights?")
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:  # assign replaced embed_tokens' parameter: tie lm_head to it
        model.lm_head.weight = model.model.embed_tokens.weight
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    # RoPE frequencies stay fp32 whatever the weights' dtype (as in transformers).
    model.rotary.inv_freq = inverse_frequencies(
        config.head_dim, config.rope_theta, config.rope_scaling).to(device)
    model.fuse_projections()
    return model

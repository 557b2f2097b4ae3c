"""Loading a Hugging Face checkpoint directory: safetensors weights only, never a pickle.

Owns turning config.json + *.safetensors into a ``DecoderLM`` on the requested device and dtype, with a
clear error for a missing, pickled, corrupt or mismatched checkpoint. The model is built on the meta
device (no storage) and each checkpoint tensor is converted to the target dtype and device as it is read,
then assigned: no full-size float32 copy of the model ever exists, so a bf16 checkpoint loaded in bf16
peaks at about its own size plus one tensor.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from minirunner.config import ModelConfig
from minirunner.model.decoder import DecoderLM
from minirunner.model.rope import inverse_frequencies

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of the float dtypes we convert from
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's *.safetensors files; each must be a regular file (reading a FIFO or a device
    would block or never end)."""
    files = sorted(model_dir.glob("*.safetensors"))
    odd = [f.name for f in files if not f.is_file()]
    if odd:
        raise ValueError(f"weight files {odd} in {str(model_dir)!r} are not regular files (a FIFO, a "
                         "device, a directory or a broken link): weights load from regular files only")
    if files:
        return files
    pickled = sorted(p.name for p in model_dir.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickled:
        raise ValueError(f"{str(model_dir)!r} holds only pickled weights ({', '.join(pickled)}); "
                         "minirunner never unpickles a checkpoint. Convert it to safetensors, e.g. "
                         "load it in a trusted environment and save_pretrained(safe_serialization=True)")
    raise ValueError(f"{str(model_dir)!r} holds no *.safetensors weights")


def check_checkpoint(model_dir: str | Path, config: ModelConfig) -> list[Path]:
    """Read only the safetensors headers and refuse, before any model is built: a config.json asking
    for more layers than the checkpoint holds (building them on the meta device alone could take
    hours). Returns the weight files."""
    model_dir = Path(model_dir)
    files = weight_files(model_dir)
    layers: set[int] = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                layers.update(int(m.group(1)) for m in map(_LAYER.match, f.keys()) if m)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"checkpoint file {file.name!r} is corrupt or unreadable ({e}); "
                             "re-download or re-save the model") from e
    if config.num_layers > len(layers):
        raise ValueError(f"config.json in {str(model_dir)!r} sets num_hidden_layers={config.num_layers} but "
                         f"the checkpoint holds tensors of {len(layers)} layers: does config.json match "
                         "the weights?")
    return files


def check_float(file: Path, name: str, stored: str) -> None:
    """Weights must be stored as floats: an integer (quantised or corrupt) tensor is refused, never cast."""
    if stored not in _FLOAT_DTYPES:
        raise ValueError(f"tensor {name!r} in {file.name!r} is stored as {stored}, not a float type; "
                         "minirunner loads float weights (fp32 / fp16 / bf16) only and never casts "
                         "integer (e.g. quantised) weights")


def load_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype,
               device: torch.device) -> DecoderLM:
    model_dir = Path(model_dir)
    files = check_checkpoint(model_dir, config)
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
                    check_float(file, name, f.get_slice(name).get_dtype())
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

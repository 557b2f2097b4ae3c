"""Attention backends and the choice between them.

``attention_backend="torch"|"triton"|"flashinfer"|"auto"`` picks one; each is imported only when chosen.
"""

from __future__ import annotations

import importlib
import logging

import torch

from minirunner.attention.base import AttentionBackend
from minirunner.attention.metadata import AttentionMetadata
from minirunner.log import warning_once

# name -> "module:Class", imported only when chosen (triton and flashinfer are optional).
BACKENDS = {
    "torch": "minirunner.attention.torch_backend:TorchAttentionBackend",
    "triton": "minirunner.attention.triton_backend:TritonAttentionBackend",
    "flashinfer": "minirunner.attention.flashinfer_backend:FlashInferAttentionBackend",
}
logger = logging.getLogger(__name__)


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception as e:  # a broken install is skipped, and said once (vLLM logs each fallback)
        warning_once(logger, "attention_backend='auto': %s is not usable here (%s); falling back",
                     module, e)
        return False
    return True


def resolve_backend_name(name: str, device: torch.device) -> str:
    """``auto``: flashinfer if importable on CUDA, else triton on CUDA, else torch."""
    if name != "auto":
        if name not in BACKENDS:
            raise ValueError(f"unknown attention_backend {name!r}; choose one of "
                             f"{sorted(BACKENDS) + ['auto']}")
        return name
    if device.type == "cuda":
        if _importable("flashinfer"):
            return "flashinfer"
        if _importable("triton"):
            return "triton"
    return "torch"


def get_backend_class(name: str) -> type[AttentionBackend]:
    module, cls = BACKENDS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise ValueError(f"attention_backend={name!r} is not available here ({e}); "
                         "use attention_backend='torch'") from e


def make_backend(config, model_config) -> AttentionBackend:
    """The attention backend an engine's config chooses, for a model of ``model_config`` (the target's
    and the draft's alike, and the KV profiler's throwaway one): the one place it is constructed."""
    return backend_for(resolve_backend_name(config.attention_backend, config.device), model_config,
                       config.block_size, config.device, config.dtype,
                       getattr(config, "batch_invariant", False))


def backend_for(name: str, model_config, block_size: int, device, dtype,
                batch_invariant: bool = False) -> AttentionBackend:
    """Backend ``name`` for the heads of ``model_config`` (one rank's heads under tensor parallelism);
    ``batch_invariant``: the torch backend's batch-invariant form (attention/batch_invariant.py)."""
    mc = model_config
    cls = get_backend_class(name)
    if batch_invariant:
        from minirunner.attention.batch_invariant import BatchInvariantAttentionBackend as cls
    return cls(mc.num_q_heads, mc.num_kv_heads, mc.head_dim, mc.head_dim ** -0.5, block_size, device, dtype)


__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "backend_for", "get_backend_class",
           "make_backend", "resolve_backend_name"]

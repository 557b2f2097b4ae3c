"""The model: our own forward pass for Llama-family decoders, and safetensors weight loading."""

from minirunner.model.decoder import DecoderLM
from minirunner.model.loader import load_model

__all__ = ["DecoderLM", "load_model"]

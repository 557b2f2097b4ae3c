"""Tiny random-init Hugging Face checkpoints for tests, built from configs (no download)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

# name -> (config class, kwargs): each exercises one architecture feature of the loader/forward.
TINY = {
    "llama": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4)),
    "llama_gqa": ("LlamaConfig", dict(num_attention_heads=8, num_key_value_heads=2,
                                      tie_word_embeddings=True)),
    "llama3_rope": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2,
                                        rope_parameters=dict(
                                            rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                            low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=32))),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24)),
    "mistral": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2,
                                      sliding_window=None)),
}


def make_tiny_model(root: Path, name: str, seed: int = 0, vocab_size: int = 96,
                    dtype: torch.dtype = torch.float32):
    """Save a tiny random model of kind ``name`` under root/name; returns (dir, HF model)."""
    cls_name, kwargs = TINY[name]
    config = getattr(transformers, cls_name)(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        max_position_embeddings=128, initializer_range=0.15, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))(config)
    # Random init leaves biases zero; make Qwen2's q/k/v biases matter.
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.5)
    model = model.to(dtype).eval()
    path = root / name
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate, EOS disabled."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


TEXT = ("the quick brown fox jumps over the lazy dog. a stitch in time saves nine. "
        "all that glitters is not gold. to be or not to be, that is the question. ") * 4


def add_tokenizer(path: Path, vocab_size: int = 96) -> None:
    """Train a small BPE tokenizer (Metaspace, so text round-trips) and save it beside the weights,
    with <pad>=0, <s>=1, </s>=2 to match the tiny configs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tok.train_from_iterator([TEXT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)

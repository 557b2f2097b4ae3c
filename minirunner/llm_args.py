"""vLLM's ``LLM(...)`` arguments that are not ours: which we accept, with what meaning, and which we refuse.

Owns checking the vLLM engine arguments a script passes without thinking (``trust_remote_code``,
``tensor_parallel_size`` (its type here; what a model and the other options allow: EngineConfig),
``kv_cache_dtype``, ``quantization``, ...): each is accepted at the values
that mean the same here, and any other value raises ValueError naming the argument and why. An
argument neither vLLM nor minirunner knows raises ValueError too (never a bare TypeError). Also the
engine seed's range and what ``device`` / ``dtype="auto"`` resolve to. It never builds an engine.
"""

from __future__ import annotations

import random

from minirunner.limits import check_seed

_ONE_DEVICE = "one engine shards a model over tensor_parallel_size devices only (no pipeline or data " \
    "parallelism)"
_LOCAL = "models load from a local directory; nothing is downloaded"
_TEXT = "the models served here are text-only"

# name -> (values accepted, why another value is refused)
ACCEPTED_VALUES: dict[str, tuple[tuple, str]] = {
    "quantization": ((None,), "weights load as stored (fp32 / bf16 / fp16); there are no quantised "
                              "kernels"),
    "revision": ((None,), _LOCAL),
    "tokenizer_revision": ((None,), _LOCAL),
    "code_revision": ((None,), _LOCAL),
    "download_dir": ((None,), _LOCAL),
    "hf_token": ((None,), _LOCAL),
    "load_format": (("auto", "safetensors"), "weights load from safetensors only (never pickle)"),
    "pipeline_parallel_size": ((1,), _ONE_DEVICE),
    "data_parallel_size": ((1,), _ONE_DEVICE),
    "distributed_executor_backend": ((None, "mp"), "tensor-parallel workers are local processes "
                                                   "(vLLM's 'mp')"),
    "cpu_offload_gb": ((0, 0.0), "weights stay on the device"),
    "skip_tokenizer_init": ((False,), "the tokenizer is loaded when the model directory has one"),
    "enable_lora": ((False,), "LoRA adapters are not supported"),
    "hf_overrides": ((None,), "config.json is read as it is"),
    "compilation_config": ((None,), "use graph_mode and cudagraph_capture_sizes"),
    "limit_mm_per_prompt": ((None,), _TEXT),
    "mm_processor_kwargs": ((None,), _TEXT),
    "enable_prompt_embeds": ((False,), "prompts are text or token ids"),
    "task": (("auto", "generate"), "only text generation is served"),
    "runner": (("auto", "generate"), "only text generation is served"),
    "logprobs_mode": (("raw_logprobs",), "logprobs are computed from the raw logits, vLLM's default"),
    "enable_sleep_mode": ((False,), "the engine holds its memory until it is deleted"),
    "calculate_kv_scales": ((False,), "the KV cache is stored in the model's dtype"),
    "kv_transfer_config": ((None,), "disaggregated prefill is out of scope here"),
    "allowed_local_media_path": (("",), _TEXT),
}
# Accepted with any value, and no effect here (why).
NO_EFFECT = {
    "served_model_name": "only the OpenAI server uses it",
    "disable_custom_all_reduce": "the all-reduces are torch.distributed's (gloo / NCCL)",
    "disable_async_output_proc": "outputs are processed in the engine loop",
    "max_seq_len_to_capture": "graphs cover decode steps of every length up to max_model_len",
}


def check_vllm_kwargs(kwargs: dict) -> None:
    """Raise ValueError for an argument of LLM(...) we cannot honour, naming it and why."""
    for name, value in kwargs.items():
        if name in NO_EFFECT:
            continue
        if name not in ACCEPTED_VALUES:
            raise ValueError(f"LLM() got an argument {name!r} that neither vLLM's offline API nor "
                             "minirunner knows here (a typo?); the README's LLM(...) table lists them")
        accepted, why = ACCEPTED_VALUES[name]
        if value not in accepted:
            raise ValueError(f"{name}={value!r} is not supported here ({why}); leave it at "
                             f"{accepted[0]!r}")


def check_named_vllm_args(trust_remote_code, tensor_parallel_size, kv_cache_dtype,
                          enable_chunked_prefill, swap_space, disable_log_stats) -> None:
    """The vLLM arguments LLM(...) names explicitly: accepted where they mean the same here."""
    if trust_remote_code:
        raise ValueError("trust_remote_code=True is refused: minirunner never runs code from a model "
                         "directory (its architectures are built in); pass trust_remote_code=False")
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) \
            or tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be an integer >= 1 (the number of ranks the model "
                         f"is sharded over), got {tensor_parallel_size!r}")
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported: the KV cache is stored "
                         "in the model's dtype; pass kv_cache_dtype='auto'")
    if enable_chunked_prefill is False:
        raise ValueError("enable_chunked_prefill=False is not supported: a prompt longer than "
                         "max_num_batched_tokens is always split over steps here (vLLM V1's "
                         "default); leave it at None or True")
    if swap_space is not None and (isinstance(swap_space, bool)
                                   or not isinstance(swap_space, (int, float)) or swap_space < 0):
        raise ValueError(f"swap_space must be a number of GiB >= 0, got {swap_space!r}")
    if not isinstance(disable_log_stats, bool):
        raise ValueError(f"disable_log_stats must be True or False, got {disable_log_stats!r}")


def resolve_seed(seed: int | None) -> int:
    """vLLM's engine seed: an integer in [0, 2**63) seeds the engine's random state; None (or -1, as
    for a request) draws a fresh one."""
    if seed is None or (seed == -1 and not isinstance(seed, bool)):
        return random.SystemRandom().randrange(2**31)
    check_seed("seed", seed)
    return seed


def resolve_generation_config(generation_config: str, model_dir: str) -> str | None:
    """The directory whose generation_config.json gives the default sampling parameters: "auto" the
    model's, "vllm" none (vLLM's own defaults), or a directory given by path."""
    if generation_config == "auto":
        return model_dir
    if generation_config == "vllm":
        return None
    if isinstance(generation_config, str):
        from pathlib import Path

        if (Path(generation_config) / "generation_config.json").is_file():
            return generation_config
    raise ValueError(f"generation_config must be 'auto' (the model's generation_config.json), 'vllm' "
                     f"(ignore it) or a directory holding a generation_config.json, got "
                     f"{generation_config!r}")

"""Configuration: the model's architecture (read from a Hugging Face config.json) and the engine's knobs.

Owns validation of everything a user configures: a config needing a feature minirunner lacks is refused
here with an error naming it. The engine's knobs come from here, not from the environment: the few
environment variables minirunner reads (a cache folder, the C compiler, the Triton interpreter, a profiler
folder) are read in one module, minirunner/envs.py, which lists them. What an engine sets while it works
(torch's threads, its compile-cache folder) is set around its work and put back (minirunner/engine_scope.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from minirunner.config_check import check_config_dict
from minirunner.engine.request_queue import check_policy
from minirunner.limits import check_engine_memory, check_finite, check_int, check_threads

logger = logging.getLogger(__name__)

# architecture name -> (q/k/v projections carry a bias, per-head RMSNorm on q and k)
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": (None, False),
    "MistralForCausalLM": (None, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (None, True),
}
SUPPORTED_ROPE_TYPES = ("default", "llama3")

KV_LAYOUTS = ("paged", "contiguous", "contiguous_exact")

_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPES.values():
            return dtype
        raise ValueError(f"dtype {dtype} is not supported; use float32, bfloat16 or float16")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use 'auto', 'float32', 'bfloat16' "
                         "or 'float16'")
    return _DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    """The torch device for LLM(device=...): "auto" is CUDA when present, else the CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA device is available; "
                         "use device='cpu'")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device} is not supported; use 'cpu', 'cuda' or 'auto'")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, config_dtype: str | None):
    """The weights' dtype for LLM(dtype=...): "auto" is float32 on a CPU, else the config's half type."""
    if dtype != "auto":
        return parse_dtype(dtype)
    if device.type == "cpu":
        return torch.float32  # exact and fast enough for the small models a CPU runs
    return parse_dtype(config_dtype) if config_dtype in ("bfloat16", "float16") else torch.bfloat16


@dataclass(frozen=True)
class ModelConfig:
    """The architecture numbers the forward pass needs, read from config.json."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    rope_theta: float
    rope_scaling: dict = field(default_factory=dict)  # {} or llama3 parameters
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    config_dtype: str | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir)
        if not path.is_dir():
            raise ValueError(f"model directory {str(model_dir)!r} does not exist")
        cfg_file = path / "config.json"
        if cfg_file.exists() and not cfg_file.is_file():
            raise ValueError(f"{str(cfg_file)!r} is not a regular file (a FIFO, a device or a directory)")
        if not cfg_file.is_file():
            raise ValueError(f"{str(model_dir)!r} holds no config.json: point model= at a Hugging "
                             "Face checkpoint directory (config.json + *.safetensors)")
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"config.json in {str(model_dir)!r} is not valid JSON: {e}") from e
        return cls.from_dict(cfg, str(cfg_file))

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> ModelConfig:
        """The architecture of a parsed config.json; ``where`` names the file in errors."""
        if not isinstance(cfg, dict):
            raise ValueError(f"{where}: must hold a JSON object ({{...}}), got a {type(cfg).__name__}")
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if isinstance(a, str) and a in SUPPORTED_ARCHITECTURES), None) \
            if isinstance(archs, list) else None
        if arch is None:
            raise ValueError(f"architecture {archs or cfg.get('model_type')!r} is not supported; "
                             f"minirunner runs {sorted(SUPPORTED_ARCHITECTURES)}")
        check_config_dict(cfg, where)  # every field's type and range, before any is used
        bias_default, qk_norm = SUPPORTED_ARCHITECTURES[arch]
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (only 'silu')")
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope type {rope_type!r} is not supported; minirunner implements "
                             f"{list(SUPPORTED_ROPE_TYPES)}")
        if cfg.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial rotary embeddings (partial_rotary_factor != 1) are not supported")
        window = cfg.get("sliding_window")
        uses_window = cfg.get("use_sliding_window", arch == "MistralForCausalLM")
        layer_types = cfg.get("layer_types") or []
        if any(t != "full_attention" for t in layer_types):
            raise ValueError(f"layer types {sorted(set(layer_types))} are not supported: minirunner "
                             "implements full attention only (no sliding-window layers)")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_q_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", bias_default) or False,
            qk_norm=qk_norm,
            rope_theta=float(rope_theta),
            rope_scaling=rope if rope_type == "llama3" else {},
            eos_token_ids=eos_ids,
            sliding_window=window if (uses_window and window) else None,
            config_dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


@dataclass
class EngineConfig:
    """Every knob of the engine, validated once. ``num_kv_blocks`` wins over ``kv_cache_memory_bytes``,
    which wins over ``gpu_memory_utilization`` (CUDA only)."""

    model: str
    dtype: torch.dtype
    device: torch.device
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    attention_backend: str = "auto"
    seed: int = 0
    kv_layout: str = "paged"  # "paged" | "contiguous" (reserve max_model_len) | "contiguous_exact"
    trace_block_tables: bool = False
    num_threads: int | str | None = "auto"  # CPU only: torch threads for its work (engine_scope.py)
    graph_mode: str = "none"  # "auto" | "none" | "cuda" | "compile": resolve_graph_mode
    cudagraph_capture_sizes: list[int] | None = None  # the bucket ladder (None: cudagraph.capture_sizes)
    speculative_config: dict | None = None  # parsed by minirunner.spec_decode.config.SpeculativeConfig
    async_scheduling: bool = False  # launch step N + 1 before reading step N (engine/in_flight.py)
    tokenizer: str | None = None  # a tokenizer directory other than the model's (vLLM's `tokenizer`)
    tokenizer_mode: str = "auto"  # "auto" / "hf": the fast tokenizer when there is one; "slow"
    max_logprobs: int = 20  # the most logprobs / prompt_logprobs a request may ask for (vLLM's default)
    tensor_parallel_size: int = 1  # ranks the model is sharded over (minirunner/distributed/tp_runner.py)
    scheduling_policy: str = "fcfs"  # or "priority" (vLLM's): engine/request_queue.py
    batch_invariant: bool = False  # a row's numbers independent of its batch (model/batch_invariant.py)

    def resolved(self, model_config: ModelConfig) -> EngineConfig:
        """This configuration checked against the model, with what "auto" / None left open decided (graph
        mode, max_model_len, the capture-size ladder): a new EngineConfig; this one is left as given.
        Raises ValueError naming the first setting that cannot work."""
        from minirunner.worker.cudagraph import capture_sizes

        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tp!r}")
        graph_mode = self.graph_mode
        if tp > 1 and graph_mode == "auto":
            graph_mode = "none"  # tensor-parallel steps run eager
            logger.info("graph_mode='auto' with tensor_parallel_size=%d: steps run eager (no graphs "
                        "under tensor parallelism)", tp)
        if self.batch_invariant and graph_mode != "none":
            from minirunner.model.batch_invariant import invariant_graph_mode

            graph_mode = invariant_graph_mode(graph_mode)
        config = replace(self, graph_mode=resolve_graph_mode(graph_mode, self.device))
        config.check(model_config)
        if config.max_model_len is None:
            limit, window = model_config.max_position_embeddings, model_config.sliding_window
            config.max_model_len = min(limit, window) if window else limit
        config.check_model_len(model_config)
        check_engine_memory(config, model_config)  # before anything is allocated
        sizes = config.cudagraph_capture_sizes
        if sizes is not None:
            config.cudagraph_capture_sizes = capture_sizes(config.max_num_seqs, sizes)
        return config

    def check(self, model_config: ModelConfig) -> None:
        """The checks that need no resolved value (raises ValueError; changes nothing)."""
        tp = self.tensor_parallel_size
        if tp > 1:
            from minirunner.distributed.tp_runner import check_tensor_parallel

            check_tensor_parallel(self, model_config)
        if self.graph_mode == "compile" and self.attention_backend not in ("auto", "torch"):
            raise ValueError(f"graph_mode='compile' needs attention_backend='torch' (got "
                             f"{self.attention_backend!r}): torch.compile traces the torch backend; the "
                             "Triton/FlashInfer kernels are captured with graph_mode='cuda'")
        check_threads(self.num_threads)
        check_policy(self.scheduling_policy)
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be True or False, got {self.batch_invariant!r}")
        if self.batch_invariant:
            from minirunner.model.batch_invariant import check_config

            check_config(self)
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {list(KV_LAYOUTS)}, got {self.kv_layout!r}")
        if self.kv_layout != "paged" and self.enable_prefix_caching:
            raise ValueError("prefix caching shares blocks between requests, which a contiguous "
                             "reservation cannot: use kv_layout='paged' or enable_prefix_caching=False")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            check_int(name, getattr(self, name))
        for name in ("num_kv_blocks", "kv_cache_memory_bytes", "max_model_len"):
            check_int(name, getattr(self, name), optional=True)
        check_finite("gpu_memory_utilization", self.gpu_memory_utilization)
        if self.tokenizer is not None:
            from minirunner.tokenizer import check_tokenizer_dir

            check_tokenizer_dir(self.tokenizer)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")

    def check_model_len(self, model_config: ModelConfig) -> None:
        """max_model_len (resolved) against the model's positions and sliding window."""
        limit, window = model_config.max_position_embeddings, model_config.sliding_window
        if not 1 <= self.max_model_len <= limit:
            raise ValueError(f"max_model_len={self.max_model_len} must be in [1, {limit}] "
                             "(the model's max_position_embeddings)")
        if window is not None and self.max_model_len > window:
            raise ValueError(f"the model uses sliding-window attention (window {window}), which "
                             f"minirunner does not implement; pass max_model_len <= {window} so the "
                             "window never applies")


GRAPH_MODES = ("auto", "none", "cuda", "compile")


def resolve_graph_mode(graph_mode: str, device: torch.device) -> str:
    """``auto``: cuda on a CUDA device, none on a CPU (compile is opt-in: it costs seconds per bucket)."""
    if graph_mode not in GRAPH_MODES:
        raise ValueError(f"graph_mode must be one of {list(GRAPH_MODES)}, got {graph_mode!r}")
    if graph_mode == "auto":
        return "cuda" if device.type == "cuda" else "none"
    if graph_mode == "cuda" and device.type != "cuda":
        raise ValueError("graph_mode='cuda' needs a CUDA device; on a CPU use graph_mode='compile' "
                         "(torch.compile per bucket) or 'none'")
    return graph_mode

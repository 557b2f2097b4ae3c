"""Our forward pass for Llama-family decoders (Llama, Mistral, Qwen2 with q/k/v bias, Qwen3 with q/k norm).

Owns the math from token ids to logits over a flat batch of query tokens. Attention goes through the
backend with explicit per-step metadata; the model never allocates KV blocks or reads global state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minirunner.attention import AttentionBackend, AttentionMetadata
from minirunner.config import ModelConfig
from minirunner.model.rope import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; the same math as below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype  # half precision: normalise in fp32, round, then scale (transformers' order)
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def matmul_layout(weights: list[torch.Tensor]) -> torch.Tensor:
    """The [in_features, out_features] operand of ``x @ w_t`` for nn.Linear weights stacked by rows.

    On a CPU it is stored contiguous: the CPU GEMM runs 15-30% faster on the small row counts of decode
    batches (4-48 rows) with the weight in this layout than with ``F.linear``'s [out, in] (measured on
    the embedded model's shapes; equal from about 96 rows). On a GPU it is the transposed view of the
    [out, in] stack (cuBLAS takes either layout at the same speed), so no copy is made there."""
    stacked = torch.cat(weights) if len(weights) > 1 else weights[0]
    w_t = stacked.t()
    return w_t.contiguous() if stacked.device.type == "cpu" else w_t


def _rebind_as_views(modules, fused: torch.Tensor, name: str, dim: int = 0) -> None:
    """Point each module's parameter ``name`` at its part of ``fused`` (same values, shared storage):
    its rows (dim 0, a bias), or its columns transposed (dim 1, a weight in :func:`matmul_layout`)."""
    start = 0
    for m in modules:
        size = getattr(m, name).shape[0]
        part = fused[start:start + size] if dim == 0 else fused[:, start:start + size].t()
        setattr(m, name, nn.Parameter(part, requires_grad=False))
        start += size


def _linear(x: torch.Tensor, w_t: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return x @ w_t if bias is None else torch.addmm(bias, x, w_t)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_q_heads, self.num_kv_heads = cfg.num_q_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_q_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_q_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        # Set by fuse_projections(): [hidden, (hq + 2 hkv) d] and [hq d, hidden] in matmul_layout.
        self.qkv_weight_t: torch.Tensor | None = None
        self.qkv_bias: torch.Tensor | None = None
        self.o_weight_t: torch.Tensor | None = None

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """One matmul for q, k and v instead of three (vLLM's QKVParallelLinear idea): the weights are
        concatenated once and q_proj / k_proj / v_proj become views of the fused tensor (no copy kept).
        o_proj's weight moves to the same :func:`matmul_layout`."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight_t = matmul_layout([p.weight for p in projs])
        _rebind_as_views(projs, self.qkv_weight_t, "weight", dim=1)
        self.o_weight_t = matmul_layout([self.o_proj.weight])
        _rebind_as_views((self.o_proj,), self.o_weight_t, "weight", dim=1)
        if self.q_proj.bias is not None:
            self.qkv_bias = torch.cat([p.bias for p in projs])
            _rebind_as_views(projs, self.qkv_bias, "bias")

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata, backend: AttentionBackend):
        n, hq, hkv, d = x.shape[0], self.num_q_heads, self.num_kv_heads, self.head_dim
        if self.qkv_weight_t is None:
            self.fuse_projections()
        qkv = _linear(x, self.qkv_weight_t, self.qkv_bias).view(n, hq + 2 * hkv, d)
        qk, v = qkv[:, :hq + hkv], qkv[:, hq + hkv:]
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qk[:, :hq]), self.k_norm(qk[:, hq:])], dim=1)
        qk = apply_rotary(qk, cos, sin)  # q and k rotated in one pass
        out = backend.forward(qk[:, :hq], qk[:, hq:], v, kv_cache, meta)
        return _linear(out.reshape(n, -1), self.o_weight_t)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_weight_t: torch.Tensor | None = None  # set by fuse_projections() (matmul_layout)
        self.down_weight_t: torch.Tensor | None = None

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """One matmul for gate and up (vLLM's MergedColumnParallelLinear idea); the two become views.
        down_proj's weight moves to the same :func:`matmul_layout`."""
        self.gate_up_weight_t = matmul_layout([self.gate_proj.weight, self.up_proj.weight])
        _rebind_as_views((self.gate_proj, self.up_proj), self.gate_up_weight_t, "weight", dim=1)
        self.down_weight_t = matmul_layout([self.down_proj.weight])
        _rebind_as_views((self.down_proj,), self.down_weight_t, "weight", dim=1)

    def forward(self, x):
        if self.gate_up_weight_t is None:
            self.fuse_projections()
        gate, up = _linear(x, self.gate_up_weight_t).chunk(2, dim=-1)
        return _linear(F.silu(gate) * up, self.down_weight_t)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, meta, backend):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """Parameter names follow Hugging Face's ``model.*`` so checkpoints load by name."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[torch.Tensor], backend: AttentionBackend) -> torch.Tensor:
        """Hidden states of a flat batch of query tokens.

        input_ids: int64 [num_tokens]; meta: this step's attention metadata (positions, slots, ...);
        kv_caches: one [num_blocks, 2, block_size, num_kv_heads, head_dim] tensor per layer.
        Returns [num_tokens, hidden_size].
        """
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(meta.positions, x.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, meta, backend)
        return self.model.norm(x)

    def fuse_projections(self) -> None:
        """Fuse q/k/v and gate/up of every layer (done once after loading, in the final dtype)."""
        for layer in self.model.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] -> fp32 logits [n, vocab_size]."""
        # lm_head keeps nn.Linear's [vocab, hidden] layout: tied, it is the embedding table, whose row
        # lookup needs that layout (a transposed copy would cost vocab x hidden).
        return self.lm_head(hidden).float()

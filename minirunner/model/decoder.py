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
from minirunner.model import batch_invariant, cpu_linear
from minirunner.model.rope import RotaryEmbedding, apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, times ``weight``: [dim], or any shape that broadcasts
    against x's trailing dims (one weight row per head: q and k heads normalised in one call)."""
    dim = x.shape[-1]
    if x.dtype == torch.float32:  # one fused op; the same math as below
        if weight.dim() == 1:
            return F.rms_norm(x, (dim,), weight, eps)
        return F.rms_norm(x, (dim,), None, eps) * weight
    dtype = x.dtype  # half precision: normalise in fp32, round, then scale (transformers' order)
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class FusedLinear:
    """The weight of one or more nn.Linear layers stacked by rows ([out_features, in_features], the
    layers' own layout: their parameters become views of it), and how a batch of rows meets it.

    On a CPU the best kernel depends on the row count (``benchmarks/linear_layouts.py``: the embedded
    model's projections with the weights coming from memory, as they do in a step, which reads every
    weight once). One row: a contiguous [in, out] copy (``x @ w_t``) is 15-25% faster than ``F.linear``.
    Two rows and more (a verify step's k + 1 rows, decode batches): the weight packed once for oneDNN
    (model/cpu_linear.py), where this torch build has it, else ``F.linear`` on [out, in]. So a CPU keeps
    up to three copies of these weights, the price of the fastest kernel at each row count; a GPU keeps
    only [out, in] (cuBLAS takes either layout at the same speed)."""

    __slots__ = ("weight", "weight_t", "bias", "packed", "out_features", "one_row_t", "invariant")

    def __init__(self, layers: list[nn.Linear]):
        self._set(torch.cat([m.weight.detach() for m in layers]).contiguous(), one_row_t=True)
        biases = [m.bias for m in layers]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        start = 0  # the layers' parameters become row views of the fused tensors (no copy kept)
        for m in layers:
            size = m.weight.shape[0]
            m.weight = nn.Parameter(self.weight[start:start + size], requires_grad=False)
            if self.bias is not None:
                m.bias = nn.Parameter(self.bias[start:start + size], requires_grad=False)
            start += size

    @classmethod
    def over(cls, weight: torch.Tensor) -> FusedLinear:
        """Another way to meet ``weight`` [out, in] (no bias), which stays what it is and where it is: a
        tied lm_head's, whose table the embedding looks rows up in. No [in, out] copy (one row keeps
        ``F.linear``); the packed copy where this CPU takes it."""
        self = cls.__new__(cls)
        self._set(weight.detach(), one_row_t=False)
        self.bias = None
        return self

    def _set(self, weight: torch.Tensor, one_row_t: bool) -> None:
        self.weight, self.out_features = weight, weight.shape[0]
        on_cpu = weight.device.type == "cpu"
        self.weight_t = weight.t().contiguous() if on_cpu and one_row_t else None
        self.packed = cpu_linear.pack(weight) if on_cpu and cpu_linear.packs(weight.dtype) else None
        # Plain flags and sizes for __call__, so torch.compile guards only the tensors a step reads.
        self.one_row_t = self.weight_t is not None
        self.invariant = 0  # batch-invariant mode: the fewest rows a call takes (model/batch_invariant.py)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.invariant:
            return batch_invariant.linear(x, self.packed, self.bias, self.out_features, self.invariant)
        if self.one_row_t and x.shape[0] == 1:
            return x @ self.weight_t if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        if self.packed is not None and x.shape[0] > 1:
            return cpu_linear.packed_linear(x, self.packed, self.bias, self.out_features)
        return F.linear(x, self.weight, self.bias)


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
        self.qkv: FusedLinear | None = None  # set by fuse_projections()
        self.o: FusedLinear | None = None
        self.qk_norm_weight: torch.Tensor | None = None

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """One matmul for q, k and v instead of three (vLLM's QKVParallelLinear idea): the weights are
        concatenated once and q_proj / k_proj / v_proj become views of the fused tensor. With q/k norm,
        one weight row per q and k head ([hq + hkv, head_dim]), so the heads normalise in one call
        (the same values as the two modules: the norm is per head either way)."""
        self.qkv = FusedLinear([self.q_proj, self.k_proj, self.v_proj])
        self.o = FusedLinear([self.o_proj])
        if self.q_norm is not None:
            hq, hkv, d = self.num_q_heads, self.num_kv_heads, self.head_dim
            self.qk_norm_weight = torch.cat((self.q_norm.weight.detach().expand(hq, d),
                                             self.k_norm.weight.detach().expand(hkv, d)))

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata, backend: AttentionBackend):
        n, hq, hkv, d = x.shape[0], self.num_q_heads, self.num_kv_heads, self.head_dim
        if self.qkv is None:
            self.fuse_projections()
        qkv = self.qkv(x).view(n, hq + 2 * hkv, d)
        qk, v = qkv[:, :hq + hkv], qkv[:, hq + hkv:]
        if self.q_norm is not None:
            qk = rms_norm(qk, self.qk_norm_weight, self.q_norm.eps)
        qk = apply_rotary(qk, cos, sin)  # q and k rotated in one pass
        out = backend.forward(qk[:, :hq], qk[:, hq:], v, kv_cache, meta)
        return self.o(out.reshape(n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: FusedLinear | None = None  # set by fuse_projections()
        self.down: FusedLinear | None = None

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """One matmul for gate and up (vLLM's MergedColumnParallelLinear idea); the two become views."""
        self.gate_up = FusedLinear([self.gate_proj, self.up_proj])
        self.down = FusedLinear([self.down_proj])

    def forward(self, x):
        if self.gate_up is None:
            self.fuse_projections()
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


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
        # lm_head keeps nn.Linear's [vocab, hidden] layout: tied, it is the embedding table, whose row
        # lookup needs that layout. Where the CPU packs weights, batches of rows meet a packed copy
        # (vocab x hidden more memory): F.linear repacks the table on every call, as it does the
        # projections' weights. The module stays (hooks and profiles still see lm_head); its forward
        # becomes the packed call.
        head = self.lm_head
        if type(head) is nn.Linear and head.bias is None:
            fused = FusedLinear.over(head.weight)
            if fused.packed is not None:
                head.forward = fused

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden_size] -> fp32 logits [n, vocab_size]."""
        return self.lm_head(hidden).float()

"""Megatron-style tensor parallelism for ``DecoderLM``: which slice of each weight a rank holds, the
layers that join the slices back, and loading only a rank's slices from safetensors.

Owns the shard plan. q/k/v and gate/up are column-parallel (each rank keeps its rows: its heads, its
slice of the MLP), o and down are row-parallel (its columns) and are followed by one all-reduce each;
the embedding and lm_head are vocabulary-parallel (a rank keeps ceil(vocab / N) rows, the last padded
with zero rows): the embedding looks up the ids it owns, zeroes the rest and all-reduces, lm_head
computes its slice of the logits and all-gathers them, so every rank ends with the full fp32 logits
(rank 0 samples). Norms and RoPE are replicated. Each rank's KV cache holds only its KV heads, under
the block tables every rank shares.

Head policy: num_q_heads must divide by N (else ValueError). KV heads: when num_kv_heads >= N they must
divide by N and each rank takes num_kv_heads / N of them; when num_kv_heads < N (MQA, or few GQA groups)
they are replicated as vLLM does: N must divide by num_kv_heads and rank r holds KV head
r // (N / num_kv_heads), the one its q heads attend to. intermediate_size must divide by N.

N = 1 never comes here: ``load_model`` builds today's unsharded model, with no extra op.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from torch import nn

from minirunner.config import ModelConfig
from minirunner.distributed.group import TPContext
from minirunner.model.decoder import DecoderLM
from minirunner.model.loader import check_checkpoint, check_float, finish_loading


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """One rank's share: its heads, MLP columns and vocabulary rows, as [start, stop) ranges."""

    rank: int
    world_size: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    mlp: tuple[int, int]
    vocab: tuple[int, int]  # the rows it reads; the shard is vocab_shard rows, zero-padded
    vocab_shard: int


def plan_shards(cfg: ModelConfig, rank: int, world_size: int) -> ShardPlan:
    """Rank ``rank``'s share of ``cfg`` split ``world_size`` ways; ValueError when it does not split."""
    n = world_size
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"tensor_parallel_size={n!r} must be a positive int")
    hq, hkv = cfg.num_q_heads, cfg.num_kv_heads
    if hq % n:
        raise ValueError(f"tensor_parallel_size={n} must divide the model's {hq} attention heads; "
                         f"pick a size that divides {hq}")
    if hkv >= n and hkv % n:
        raise ValueError(f"tensor_parallel_size={n} must divide the model's {hkv} KV heads; "
                         f"pick a size that divides {hkv}")
    if hkv < n and n % hkv:
        raise ValueError(f"tensor_parallel_size={n} exceeds the model's {hkv} KV heads, which are "
                         f"then replicated: it must be a multiple of {hkv}")
    if cfg.intermediate_size % n:
        raise ValueError(f"tensor_parallel_size={n} must divide intermediate_size="
                         f"{cfg.intermediate_size}")
    qs, ms = hq // n, cfg.intermediate_size // n
    if hkv >= n:
        kv = (rank * hkv // n, (rank + 1) * hkv // n)
    else:
        head = rank // (n // hkv)
        kv = (head, head + 1)
    vs = -(-cfg.vocab_size // n)
    vocab = (min(rank * vs, cfg.vocab_size), min((rank + 1) * vs, cfg.vocab_size))
    return ShardPlan(rank, n, (rank * qs, rank * qs + qs), kv, (rank * ms, rank * ms + ms), vocab, vs)


def local_config(cfg: ModelConfig, plan: ShardPlan) -> ModelConfig:
    """The config of one rank's model: its head counts and MLP width (vocab_size stays the full one:
    the logits every rank ends with are full). The runner sizes that rank's KV cache from it."""
    return dataclasses.replace(cfg, num_q_heads=plan.q_heads[1] - plan.q_heads[0],
                               num_kv_heads=plan.kv_heads[1] - plan.kv_heads[0],
                               intermediate_size=plan.mlp[1] - plan.mlp[0])


class VocabParallelEmbedding(nn.Module):
    """The embedding rows [start, start + rows) of the vocabulary; ids outside look up zeros, and the
    all-reduce fills them in from the rank that owns them."""

    def __init__(self, rows: int, dim: int, start: int, tp: TPContext):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim))
        self.start, self.tp = start, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        return self.tp.all_reduce(x * mine[:, None].to(x.dtype))


class ParallelLMHead(nn.Module):
    """This rank's vocabulary rows of lm_head; the forward all-gathers the full [n, vocab] logits."""

    def __init__(self, rows: int, dim: int, vocab_size: int, tp: TPContext):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim))
        self.vocab_size, self.tp = vocab_size, tp
        self.project = None  # batch-invariant mode: its linear (model/batch_invariant.py)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = F.linear(hidden, self.weight) if self.project is None else self.project(hidden)
        return self.tp.all_gather_last(local)[:, :self.vocab_size]


class RowParallel:
    """A row-parallel projection (o or down): the rank's partial product, then one all-reduce."""

    __slots__ = ("linear", "tp")

    def __init__(self, linear, tp: TPContext):
        self.linear, self.tp = linear, tp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.linear(x))


def _slice_of(name: str, plan: ShardPlan, cfg: ModelConfig) -> tuple[int, int, int] | None:
    """(dim, start, stop) of checkpoint tensor ``name`` that this rank reads; None = replicated."""
    d = cfg.head_dim
    leaf = name.rsplit(".", 2)[-2:]
    module, kind = leaf[0], leaf[1]
    if module in ("embed_tokens", "lm_head"):
        return (0, *plan.vocab)
    if module == "q_proj":
        return (0, plan.q_heads[0] * d, plan.q_heads[1] * d)
    if module in ("k_proj", "v_proj"):
        return (0, plan.kv_heads[0] * d, plan.kv_heads[1] * d)
    if module == "o_proj" and kind == "weight":
        return (1, plan.q_heads[0] * d, plan.q_heads[1] * d)
    if module in ("gate_proj", "up_proj"):
        return (0, *plan.mlp)
    if module == "down_proj":
        return (1, *plan.mlp)
    return None


def load_sharded_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype,
                       device: torch.device, tp: TPContext) -> DecoderLM:
    """This rank's shard of the checkpoint as a ``DecoderLM`` whose collectives run over ``tp``.

    Each tensor's slice is read with safetensors' ``get_slice``: a rank never holds another rank's
    weights, nor the whole model. ``model.config`` is the rank's local config (its KV heads)."""
    plan = plan_shards(config, tp.rank, tp.world_size)
    local = local_config(config, plan)
    with torch.device("meta"):
        model = DecoderLM(local)
        model.model.embed_tokens = VocabParallelEmbedding(plan.vocab_shard, config.hidden_size,
                                                          plan.vocab[0], tp)
        model.lm_head = ParallelLMHead(plan.vocab_shard, config.hidden_size, config.vocab_size, tp)
    expected = {name: p.shape for name, p in model.named_parameters()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    tensors: dict[str, torch.Tensor] = {}
    for file in check_checkpoint(model_dir, config):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name not in expected:
                        continue
                    part = f.get_slice(name)
                    check_float(file, name, part.get_dtype())
                    cut = _slice_of(name, plan, config)
                    if cut is None:
                        t = part[:]
                    elif cut[0] == 0:
                        t = part[cut[1]:cut[2]]
                    else:
                        t = part[:, cut[1]:cut[2]]
                    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
                        t = F.pad(t, (0, 0, 0, plan.vocab_shard - t.shape[0]))
                    if tuple(t.shape) != tuple(expected[name]):
                        raise ValueError(f"tensor {name!r} has a shard of shape {tuple(t.shape)} but "
                                         f"the config implies {tuple(expected[name])}")
                    tensors[name] = t.to(device=device, dtype=dtype)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"checkpoint file {file.name!r} is corrupt or unreadable ({e}); "
                             "re-download or re-save the model") from e
    finish_loading(model, tensors, set(expected), model_dir, device)
    for layer in model.model.layers:
        layer.self_attn.o = RowParallel(layer.self_attn.o, tp)
        layer.mlp.down = RowParallel(layer.mlp.down, tp)
    model.tp = tp
    return model

"""One tensor-parallel process group: joining it, and the rank state the sharded model is handed.

Owns choosing the backend (gloo on a CPU, NCCL on CUDA), the localhost rendezvous on a free port (a TCP
store rank 0 serves; the group is standalone, not torch.distributed's default one), and
:class:`TPContext`, the small object every sharded layer receives explicitly (rank, world size, group)
with the two collectives tensor parallelism needs: an all-reduce after a row-parallel matmul and an
all-gather of vocabulary shards. Nothing in the model reads a global or ``torch.distributed``'s default
group behind the caller's back, so one process may drive several groups.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


def backend_for(device: str | torch.device) -> str:
    """The collective backend for a device: "nccl" on CUDA, "gloo" on a CPU."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "nccl"
    if kind == "cpu":
        return "gloo"
    raise ValueError(f"tensor parallelism runs on 'cpu' (gloo) or 'cuda' (NCCL), not device={kind!r}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it); the rendezvous binds it next."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class TPContext:
    """Where this process sits in a tensor-parallel group. ``group`` None means one device (world 1).

    ``group`` is a standalone process group (a gloo or NCCL backend object over its own TCP store), not
    ``torch.distributed``'s default group: one process may hold several (two tensor-parallel LLMs at
    once), and dropping the context frees it."""

    rank: int = 0
    world_size: int = 1
    group: object | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns it (the row-parallel matmul's partial sums)."""
        if self.world_size > 1:
            self.group.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` (equal shapes) along the last dim, in rank order."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self.group.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)


def init_group(rank: int, world_size: int, port: int, device: str | torch.device,
               timeout_s: float = 300.0) -> TPContext:
    """Join the group at 127.0.0.1:``port`` (rank 0 serves the TCP store there) as ``rank`` of
    ``world_size``; returns its context.

    On CUDA, rank r uses device cuda:r. ``timeout_s`` bounds the rendezvous and each gloo collective (a
    peer that stops answering without closing its socket). A peer that dies closes its sockets, and
    gloo raises at once instead."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
    backend = backend_for(device)
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0, timeout)
    if backend == "nccl":
        torch.cuda.set_device(rank)  # rank r drives cuda:r
        group = dist.ProcessGroupNCCL(store, rank, world_size)
    else:
        group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    return TPContext(rank, world_size, group)

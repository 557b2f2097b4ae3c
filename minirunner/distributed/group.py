"""One tensor-parallel process group: joining it, and the rank state the sharded model is handed.

Owns choosing the backend (gloo on a CPU, NCCL on CUDA), the loopback-only rendezvous (a TCP store rank
0 serves on a socket it bound to 127.0.0.1 itself; gloo's pair sockets pinned to 127.0.0.1 too; the
group is standalone, not torch.distributed's default one), and
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


LOOPBACK = "127.0.0.1"


def bind_loopback() -> socket.socket:
    """A TCP socket bound to 127.0.0.1 on a port the OS picks, for rank 0's store to listen on.

    Handing the store an already-bound socket (``master_listen_fd``) matters twice: torch's store,
    given only a port, listens on every interface (``*:port``, reachable from the network, with no
    authentication), and a port probed free and bound later could be taken in between."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    return sock


@dataclass(eq=False)
class TPContext:
    """Where this process sits in a tensor-parallel group. ``group`` None means one device (world 1).

    ``group`` is a standalone process group (a gloo or NCCL backend object over its own TCP store), not
    ``torch.distributed``'s default group: one process may hold several (two tensor-parallel LLMs at
    once). ``close()`` shuts the group down and drops it and the store at once (every sharded layer
    holds this same object, so nothing keeps their sockets open until garbage collection)."""

    rank: int = 0
    world_size: int = 1
    group: object | None = None
    store: object | None = None
    # batch-invariant mode: sums in rank order (all-gather, then add), never the backend's ring order,
    # whose split of a tensor over the ranks depends on its size (model/batch_invariant.py)
    fixed_order: bool = False

    def close(self) -> None:
        """Shut the process group down and drop it and its store (their sockets close now)."""
        group, self.group, self.store = self.group, None, None
        if group is not None and hasattr(group, "shutdown"):
            try:
                group.shutdown()
            except RuntimeError:
                pass  # a group whose peer died may refuse a clean shutdown; dropping it frees it

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns it (the row-parallel matmul's partial sums)."""
        if self.world_size > 1 and self.fixed_order:
            parts = [torch.empty_like(x) for _ in range(self.world_size)]
            self.group.allgather([parts], [x.contiguous()]).wait()
            total = parts[0]
            for part in parts[1:]:
                total += part
            return x.copy_(total)
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
               timeout_s: float = 300.0, listen_fd: int | None = None) -> TPContext:
    """Join the group at 127.0.0.1:``port`` (rank 0 serves the TCP store there) as ``rank`` of
    ``world_size``; returns its context. Rank 0 passes ``listen_fd``, the socket ``bind_loopback``
    bound to ``port`` (the store takes it over and closes it).

    On CUDA, rank r uses device cuda:r. ``timeout_s`` bounds the rendezvous and each gloo collective (a
    peer that stops answering without closing its socket). A peer that dies closes its sockets, and
    gloo raises at once instead."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
    backend = backend_for(device)
    timeout = timedelta(seconds=timeout_s)
    if (rank == 0) != (listen_fd is not None):
        raise ValueError("rank 0 serves the store on listen_fd (from bind_loopback); the others pass none")
    store = dist.TCPStore(LOOPBACK, port, world_size, rank == 0, timeout, master_listen_fd=listen_fd)
    if backend == "nccl":
        torch.cuda.set_device(rank)  # rank r drives cuda:r
        group = dist.ProcessGroupNCCL(store, rank, world_size)
    else:
        # gloo's pair sockets on loopback too: by default gloo binds the address the host name
        # resolves to, which may be a LAN address. torch offers a chosen device only through these
        # options (torch has no public spelling for them).
        options = dist.ProcessGroupGloo._Options()  # noqa: SLF001
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)]  # noqa: SLF001
        options._timeout = timeout  # noqa: SLF001
        group = dist.ProcessGroupGloo(store, rank, world_size, options)
    return TPContext(rank, world_size, group, store)

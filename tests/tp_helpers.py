"""A rank object for the worker-lifecycle tests: real collectives and a real error, no model.

Importable on its own (torch and minirunner only), so a driver started in a subprocess can use it.
"""

from __future__ import annotations

import torch

from minirunner.distributed import TPContext


class Collectives:
    """Built on every rank by ``WorkerGroup(N, "cpu", Collectives)``."""

    def __init__(self, tp: TPContext):
        self.tp = tp

    def ping(self) -> list[float]:
        """One all-reduce of ones: [N, N] on every rank."""
        return self.tp.all_reduce(torch.ones(2)).tolist()

    def spin(self, n: int) -> int:
        """``n`` all-reduces in a row (long enough to be interrupted in the middle)."""
        x = torch.zeros(1)
        for _ in range(n):
            self.tp.all_reduce(x)
        return n

    def raise_on(self, rank: int) -> list[float]:
        """Raise ValueError on ``rank`` while the others wait in an all-reduce it never joins."""
        if self.tp.rank == rank:
            raise ValueError(f"deliberate failure on rank {rank}")
        return self.ping()

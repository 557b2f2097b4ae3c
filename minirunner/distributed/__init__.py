"""Tensor parallelism over torch.distributed: the process group, the worker processes, a rank's shard.

``group`` joins a process group (gloo on CPU, NCCL on CUDA) and hands out :class:`TPContext`;
``workers`` starts and supervises the worker processes from the driver; ``shard_worker`` is what each
rank runs; ``tp_runner`` is the engine's runner under ``LLM(tensor_parallel_size=N)`` (rank 0's
ModelRunner, the workers in lockstep). The sharded layers themselves live in
``minirunner/model/tensor_parallel.py``.
"""

from minirunner.distributed.group import TPContext, backend_for, bind_loopback, init_group
from minirunner.distributed.workers import WorkerError, WorkerGroup

__all__ = ["TPContext", "WorkerError", "WorkerGroup", "backend_for", "bind_loopback", "init_group"]

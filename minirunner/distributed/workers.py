"""The worker processes of a tensor-parallel group, seen from the driver (rank 0).

Owns starting N - 1 workers with torch.multiprocessing (spawn), the driver->worker command channel,
errors and liveness, and shutdown. Rank 0 is the driver process itself: it keeps the scheduler and the
KV bookkeeping and runs its own shard in-process, so ``call`` sends the command to the workers, runs the
same method on the driver's shard, then collects one reply per worker. ``run_posted`` generalises it for
the engine's step: the driver's own part ``post``s each command just before the collectives it pairs
with (the forward, then each logits computation), and the replies are collected at the end.

The command channel is one ``multiprocessing`` Pipe per worker, carrying a pickled
(method, args, kwargs) per call. Not a broadcast over the process group: NCCL moves tensors, not Python
objects, and a collective waiting on a dead peer can only time out; not nano-vllm's shared-memory
buffer + events either, which is faster per step but knows nothing of the other end's death. A pipe
gives liveness for free: a worker blocked in ``recv`` gets EOF the moment the driver dies and exits,
and the driver waits on each worker's pipe *and* its process sentinel, so a worker that dies is seen at
once, not after a timeout. The per-step message is a few kilobytes of host arrays; tensors themselves
(activations, logits) only ever travel over the process group.

Errors: a worker that raises sends its formatted traceback and exits (its peers may be blocked in a
collective it will never join; its exit closes their sockets, so gloo raises in them at once). The
driver raises :class:`WorkerError` carrying that traceback; after any failure the group is unusable and
is torn down. Workers ignore SIGINT (Ctrl-C reaches the driver, which decides), watch their parent's pid
(an orphan exits within half a second), and are daemons; ``close()`` (also the context manager's exit,
``__del__`` and an atexit hook) asks them to stop (after a failure: terminates them), then kills any
that linger.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import traceback
import weakref
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp

from minirunner.distributed.group import TPContext, bind_loopback, init_group
from minirunner.distributed.main_guard import check_main_guard


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed or died; the message carries its traceback or exit code."""


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)  # the driver died: no orphan outlives it
        time.sleep(0.5)


def _worker_main(rank, world_size, port, device, factory, args, conn, parent_pid) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        obj = factory(init_group(rank, world_size, port, device), *args)
        conn.send(("ok", None))
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                break  # the driver is gone
            if msg is None:
                break
            method, a, kw = msg
            conn.send(("ok", getattr(obj, method)(*a, **kw)))
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)  # closes this rank's sockets: peers in a collective raise instead of waiting
    conn.close()


class WorkerGroup:
    """Rank 0 (this process) plus ``world_size - 1`` spawned workers, each holding ``factory(ctx, *args)``.

    ``factory`` must be picklable (a module-level function or class); it receives the rank's
    :class:`TPContext`. ``call(name, ...)`` runs ``obj.name(...)`` on every rank and returns rank 0's
    result. ``timeout_s``: the longest a reply may take once the driver's own part is done."""

    def __init__(self, world_size: int, device: str | torch.device, factory, args: tuple = (),
                 timeout_s: float = 300.0):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r} must be a positive int")
        check_main_guard()  # before any process starts
        self.world_size, self.timeout_s = world_size, timeout_s
        self._closed, self._broken, self._pending = False, False, 0
        self.procs, self.conns = [], []
        self.ctx = self.local = None
        listener = bind_loopback()  # rank 0's store listens on it (loopback only); bound before any
        port, spawn = listener.getsockname()[1], mp.get_context("spawn")  # worker is told the port
        for rank in range(1, world_size):
            parent, child = spawn.Pipe()
            proc = spawn.Process(target=_worker_main, name=f"minirunner-tp-rank{rank}", daemon=True,
                                 args=(rank, world_size, port, device, factory, args, child, os.getpid()))
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        atexit.register(_close_ref, weakref.ref(self))
        try:
            self.ctx = self._join(port, device, listener.detach())  # the store owns the fd now
            self.local = factory(self.ctx, *args)
            self._replies()
        except BaseException:
            listener.close()  # a no-op once detached
            self._broken = True
            self.close()
            raise

    def _join(self, port: int, device, listen_fd: int) -> TPContext:
        """Join the group in a thread, so a worker that dies before joining raises here at once."""
        box: dict = {}

        def join():
            try:
                box["ctx"] = init_group(0, self.world_size, port, device, listen_fd=listen_fd)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                box["error"] = e

        thread = threading.Thread(target=join, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.1)
            for rank, (proc, conn) in enumerate(zip(self.procs, self.conns, strict=True), 1):
                if not proc.is_alive():  # a worker that fails sends its error, then exits
                    self._reply(rank, conn, proc)  # raises with that error
        if "error" in box:
            raise box["error"]
        return box["ctx"]

    def call(self, method: str, *args, **kwargs):
        """Run ``method(*args, **kwargs)`` on every rank's object; returns rank 0's result."""
        return self.run_with(lambda: getattr(self.local, method)(*args, **kwargs), method,
                             *args, **kwargs)

    def run_with(self, local, method: str, *args, **kwargs):
        """Send ``method(*args, **kwargs)`` to the workers, run ``local()`` here (the driver's own part,
        joining the same collectives: e.g. its runner's step over the batch the workers were sent),
        then collect every worker's reply; returns ``local()``'s result."""
        def posted():
            self.post(method, *args, **kwargs)
            return local()
        return self.run_posted(posted)

    def post(self, method: str, *args, **kwargs) -> None:
        """Send ``method(*args, **kwargs)`` to every worker without waiting for its reply: call it from
        inside ``run_posted``'s ``local``, just before the driver's own part of the same collectives, so
        one driver step can hand the workers several commands in the order its collectives run."""
        if self._closed or self._broken:
            raise RuntimeError("this tensor-parallel group is closed or failed earlier; start a new one")
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns, strict=True), 1):
            try:
                conn.send((method, args, kwargs))
            except OSError as e:  # a worker that died between calls closed its end of the pipe
                raise WorkerError(f"tensor-parallel worker rank {rank} (pid {proc.pid}) is gone (exit "
                                  f"code {proc.exitcode}): its command pipe is closed ({e})") from e
        self._pending += 1

    def run_posted(self, local):
        """Run ``local()`` here (it may ``post`` commands to the workers), then collect every worker's
        reply to each command posted; returns ``local()``'s result. Any failure (a worker's error, a
        dead worker, an interrupt) tears the group down and raises."""
        if self._closed or self._broken:
            raise RuntimeError("this tensor-parallel group is closed or failed earlier; start a new one")
        try:
            try:
                result = local()
            except Exception:
                for _ in range(self._pending):  # a worker's own error explains a failed collective
                    self._replies(grace_s=5.0)
                raise
            for _ in range(self._pending):
                self._replies()
            self._pending = 0
            return result
        except BaseException:
            self._broken = True
            self.close()
            raise

    def _replies(self, grace_s: float | None = None) -> None:
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns, strict=True), 1):
            self._reply(rank, conn, proc, grace_s)

    def _reply(self, rank: int, conn, proc, timeout_s: float | None = None):
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            ready = wait([conn, proc.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            if conn in ready or conn.poll():
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):  # a duplex pipe is a socket: a dead peer resets it
                    status, value = "dead", None
                if status == "ok":
                    return value
                if status == "error":
                    raise WorkerError(f"tensor-parallel worker rank {rank} raised:\n{value}")
            if ready:  # the sentinel: the process exited without a reply
                proc.join(1.0)
                raise WorkerError(f"tensor-parallel worker rank {rank} (pid {proc.pid}) died with exit "
                                  f"code {proc.exitcode} before replying")
            if time.monotonic() >= deadline:
                if timeout_s is not None:
                    return None
                raise WorkerError(f"tensor-parallel worker rank {rank} did not reply within "
                                  f"{self.timeout_s} s")

    def close(self) -> None:
        """Stop every worker and drop rank 0's part (its shard and process group). After a clean run
        the workers are asked to stop; after a failure or an interrupt (a worker may be stuck in a
        collective) they are terminated at once; any that lingers is killed."""
        if self._closed:
            return
        self._closed = True
        for proc, conn in zip(self.procs, self.conns, strict=True):
            try:
                if self._broken:
                    proc.terminate()
                else:
                    conn.send(None)
            except (OSError, ValueError):
                pass  # that worker is gone already
        for proc in self.procs:
            proc.join(2.0 if self._broken else 5.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        if self.ctx is not None:  # the runner still holds the shard: shut its group down now
            self.ctx.close()
        self.local = self.ctx = None

    def pids(self) -> list[int]:
        """The workers' process ids (rank 1 first)."""
        return [p.pid for p in self.procs]

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_closed"):
            self.close()


def _close_ref(ref) -> None:
    group = ref()
    if group is not None:
        group.close()

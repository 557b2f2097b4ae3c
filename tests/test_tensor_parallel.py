"""Tensor parallelism on CPU over gloo, with real worker processes (torch.multiprocessing spawn).

N = 2 shards of tiny fp32 Llama (GQA, tied embeddings), Qwen2 (q/k/v bias), Qwen3 (q/k norm, a vocabulary
that does not split evenly) and an MQA Llama (one KV head, replicated) run a scripted paged schedule —
chunked prefill mixed with decode, a prefix-cache hit on shared blocks, a preemption recomputed into
fresh blocks, a second completion forked with a copy-on-write block copy — and give the logits (and
logprobs) of one device, today's unsharded model, within 1e-5, and the same greedy tokens. Head counts
that do not split raise ValueError. A worker's error reaches the driver with its traceback; a killed
worker makes the driver raise within seconds; closing (or Ctrl-C) leaves no process, and a worker whose
driver dies exits.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import transformers
from tiny_models import make_tiny_model
from tp_helpers import Collectives

from minirunner.config import ModelConfig
from minirunner.distributed import TPContext, WorkerError, WorkerGroup
from minirunner.distributed.shard_worker import ShardWorker, StepBatch
from minirunner.model.tensor_parallel import plan_shards

BLOCK, NUM_BLOCKS = 4, 40


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


class Schedule:
    """A hand-run paged schedule: sequences with block tables from one pool, and one step's batch."""

    def __init__(self):
        self.tokens, self.tables, self.computed = {}, {}, {}
        self.free = list(range(NUM_BLOCKS))

    def add(self, name, prompt, shared_from=None, shared_blocks=0):
        self.tokens[name] = list(prompt)
        self.tables[name] = list(self.tables[shared_from][:shared_blocks]) if shared_from else []
        self.computed[name] = shared_blocks * BLOCK  # a prefix-cache hit: those blocks hold its KV

    def fork(self, name, parent):
        """A second completion of ``parent`` (n > 1): its full blocks shared, its partial last block
        copied (copy-on-write). Returns the (src, dst) block copies to make in every rank's cache."""
        done = self.computed[parent]
        self.tokens[name] = list(self.tokens[parent])
        self.tables[name] = self.tables[parent][:done // BLOCK]
        self.computed[name] = done
        if done % BLOCK == 0:
            return [], []
        self.tables[name].append(self.free.pop(0))
        return [self.tables[parent][done // BLOCK]], [self.tables[name][-1]]

    def preempt(self, name):
        """Free the blocks (recompute preemption; shared blocks stay with their owner)."""
        self.free += [b for b in self.tables[name] if all(
            b not in t for n, t in self.tables.items() if n != name)]
        self.tables[name], self.computed[name] = [], 0

    def batch(self, work):
        """work: [(name, new tokens or None for all remaining)] -> (StepBatch, names that sample)."""
        ids, pos, slots, qsl, lens, rows, tables, samplers = [], [], [], [0], [], [], [], []
        for name, n in work:
            start = self.computed[name]
            n = len(self.tokens[name]) - start if n is None else n
            while len(self.tables[name]) * BLOCK < start + n:
                self.tables[name].append(self.free.pop(0))
            for p in range(start, start + n):
                ids.append(self.tokens[name][p])
                pos.append(p)
                slots.append(self.tables[name][p // BLOCK] * BLOCK + p % BLOCK)
            qsl.append(qsl[-1] + n)
            lens.append(start + n)
            tables.append(self.tables[name])
            self.computed[name] = start + n
            if start + n == len(self.tokens[name]):
                rows.append(qsl[-1] - 1)
                samplers.append(name)
        width = max(len(t) for t in tables)
        table_arr = np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32)
        return StepBatch(np.array(ids), np.array(pos), np.array(slots), np.array(qsl, dtype=np.int32),
                         np.array(lens, dtype=np.int32), table_arr, np.array(rows)), samplers


def run_schedule(execute, copy_blocks, vocab):
    """The scripted steps; returns every step's logits and the greedy tokens each sequence emitted."""
    g = torch.Generator().manual_seed(0)
    prompt = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    s = Schedule()
    s.add("a", prompt(10))
    s.add("b", prompt(13))
    steps = [[("a", None), ("b", 6)],                     # a's prefill, b's first chunk
             [("b", None), ("a", 1)],                     # b's last chunk, a decodes
             "c",                                         # c arrives: a prefix-cache hit on a's blocks
             [("c", None), ("a", 1), ("b", 1)],
             "preempt b",
             [("a", 1), ("c", 1)],
             "fork d",                                    # d: a's second completion
             [("b", None), ("a", 1), ("c", 1), ("d", 1)],  # b recomputed into fresh blocks
             [("a", 1), ("b", 1), ("c", 1), ("d", 1)],
             [("a", 1), ("b", 1), ("c", 1), ("d", 1)]]
    all_logits, out = [], {"a": [], "b": [], "c": [], "d": []}
    for work in steps:
        if work == "c":
            s.add("c", s.tokens["a"][:8] + prompt(3), shared_from="a", shared_blocks=2)
            continue
        if work == "fork d":
            copy_blocks(*s.fork("d", "a"))
            continue
        if work == "preempt b":
            s.preempt("b")
            continue
        batch, samplers = s.batch(work)
        logits = execute(batch)
        all_logits.append(logits)
        if "d" in samplers:  # the copied block holds a's KV: d scores exactly as a does
            rows = {n: i for i, n in enumerate(samplers)}
            torch.testing.assert_close(logits[rows["d"]], logits[rows["a"]], atol=1e-5, rtol=0)
        for name, token in zip(samplers, logits.argmax(-1).tolist(), strict=True):
            s.tokens[name].append(token)
            out[name].append(token)
    return all_logits, out


def make_mqa(root):
    """A Llama with 4 q heads sharing one KV head: with N = 2 that head is replicated."""
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                   max_position_embeddings=128, initializer_range=0.15)
    torch.manual_seed(0)
    path = root / "llama_mqa"
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2", "qwen3", "llama_mqa"])
def test_two_ranks_match_one_device(tmp_path, name):
    if name == "llama_mqa":
        path, vocab = make_mqa(tmp_path), 96
    else:
        vocab = 97 if name == "qwen3" else 96  # 97: the last vocabulary shard is padded
        path, _ = make_tiny_model(tmp_path, name, vocab_size=vocab)
    args = (str(path), "float32", NUM_BLOCKS, BLOCK, "torch", "cpu", 1)
    one = ShardWorker(TPContext(), *args)  # today's unsharded model, in this process
    ref_logits, ref_tokens = run_schedule(one.execute, one.copy_blocks, vocab)
    with WorkerGroup(2, "cpu", ShardWorker, args) as group:
        assert group.local.kv_heads() * (1 if name == "llama_mqa" else 2) == one.kv_heads()
        size = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        assert size(group.local.model) < 0.6 * size(one.model)  # rank 0 holds about half
        tp_logits, tp_tokens = run_schedule(lambda b: group.call("execute", b),
                                            lambda src, dst: group.call("copy_blocks", src, dst), vocab)
    assert tp_tokens == ref_tokens
    for tp, ref in zip(tp_logits, ref_logits, strict=True):
        assert tp.shape == ref.shape == (tp.shape[0], vocab)
        torch.testing.assert_close(tp, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(tp.log_softmax(-1), ref.log_softmax(-1), atol=1e-5, rtol=0)


def test_head_counts_that_do_not_split(tmp_path):
    base = ModelConfig.from_dir(make_tiny_model(tmp_path, "qwen2")[0])  # 4 q heads, 2 KV heads
    cfg = lambda **kw: base.__class__(**{**base.__dict__, **kw})  # noqa: E731
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide the model's 4 attention"):
        plan_shards(base, 0, 3)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 must divide the model's 3 KV heads"):
        plan_shards(cfg(num_q_heads=6, num_kv_heads=3), 0, 2)
    with pytest.raises(ValueError, match="exceeds the model's 2 KV heads.*multiple of 2"):
        plan_shards(cfg(num_q_heads=6, num_kv_heads=2), 0, 3)
    with pytest.raises(ValueError, match="must divide intermediate_size=96"):
        plan_shards(cfg(num_q_heads=10, num_kv_heads=5, intermediate_size=96), 0, 5)
    # fewer KV heads than ranks: replicated, rank r on the head its q heads attend to (vLLM's policy)
    assert [plan_shards(cfg(num_q_heads=8), r, 4).kv_heads for r in range(4)] == \
        [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [plan_shards(cfg(num_q_heads=8), r, 4).q_heads for r in range(4)] == \
        [(0, 2), (2, 4), (4, 6), (6, 8)]


def _gone(pids, within_s=5.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


def test_worker_error_reaches_driver_with_its_traceback():
    group = WorkerGroup(2, "cpu", Collectives)
    assert group.call("ping") == [2.0, 2.0]
    pids = group.pids()
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"(?s)rank 1 raised:.*Traceback.*in raise_on.*"
                                          r"ValueError: deliberate failure on rank 1"):
        group.call("raise_on", 1)
    assert time.monotonic() - start < 10
    with pytest.raises(RuntimeError, match="closed or failed earlier"):
        group.call("ping")
    assert _gone(pids)


def test_killed_worker_makes_the_driver_raise_within_seconds():
    group = WorkerGroup(2, "cpu", Collectives)
    assert group.call("spin", 10) == 10
    (pid,) = group.pids()
    killed = []

    def kill():
        time.sleep(0.5)
        killed.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    with pytest.raises((WorkerError, RuntimeError)):
        group.call("spin", 10**9)  # the kill lands in the middle of this call
    assert killed and time.monotonic() - killed[0] < 10
    assert _gone([pid])


def test_close_leaves_no_process():
    with WorkerGroup(3, "cpu", Collectives) as group:
        assert group.call("ping") == [3.0, 3.0]
        pids = group.pids()
        assert len(pids) == 2 and all(alive(p) for p in pids)
    assert _gone(pids, within_s=0.0)  # close() joined them
    assert not [p for p in multiprocessing.active_children() if p.pid in pids]


def _lines(proc) -> queue.Queue:
    """The driver's lines of output, read on a thread, so a test waits on them with a timeout."""
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put("")  # end of output, as readline() gives it

    threading.Thread(target=read, daemon=True).start()
    return lines


def _line(proc, lines: queue.Queue, timeout_s: float = 60.0) -> str:
    """The next line, or a failure that says what the driver wrote to stderr (never a hang)."""
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers (a session of their own)
        raise AssertionError(f"no line from the driver within {timeout_s} s; stderr:\n"
                             f"{proc.stderr.read()}") from None


def test_ctrl_c_and_driver_death_leave_no_worker():
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) mid-call: the workers ignore
    it, the driver raises KeyboardInterrupt and closes them. Then a second group's driver is killed:
    its worker notices and exits."""
    tests = os.path.dirname(os.path.abspath(__file__))
    driver = ("import os, signal\n"
              # Python's own Ctrl-C handler, as under a terminal: a shell that starts the tests in the
              # background (no job control) hands its children SIGINT ignored
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from minirunner.distributed import WorkerGroup\n"
              "from tp_helpers import Collectives\n"
              "group = WorkerGroup(2, 'cpu', Collectives)\n"
              "print('spinning', *group.pids(), flush=True)\n"
              "try:\n"
              "    group.call('spin', 10**9)\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted', flush=True)\n"
              "group = WorkerGroup(2, 'cpu', Collectives)\n"
              "print('second', group.call('ping')[0], *group.pids(), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(tests), tests])}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = _lines(proc)
        first = _line(proc, lines).split()
        assert first[0] == "spinning", proc.stderr.read()
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        assert _line(proc, lines).strip() == "interrupted"
        assert _gone([int(first[1])], within_s=0.0)  # closed before the driver went on
        second = _line(proc, lines).split()
        assert second[:2] == ["second", "2.0"], proc.stderr.read()
        assert proc.wait(timeout=60) == -signal.SIGKILL
        assert _gone([int(second[2])], within_s=5.0)
    finally:
        if proc.poll() is None:
            proc.kill()

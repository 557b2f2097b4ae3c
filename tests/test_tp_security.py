"""Tensor parallelism's exposure and lifetime, on CPU over gloo with real worker processes.

While an ``LLM(tensor_parallel_size=2)`` is alive, every TCP socket that the driver and its worker
listen on is bound to 127.0.0.1 (the rendezvous store and gloo's pair sockets: nothing is reachable from
another machine); ``close()`` closes the driver's listeners at once, while the LLM object is still
referenced. A worker killed between two calls makes the next call raise WorkerError naming the rank
(never a raw BrokenPipeError). A script that starts tensor parallelism at module level, without an
``if __name__ == "__main__":`` guard, fails at once in the driver with a message saying to add it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from test_tensor_parallel import alive
from tiny_models import make_tiny_model

from minirunner import LLM, SamplingParams
from minirunner.distributed import WorkerError

SMALL = dict(device="cpu", attention_backend="torch", num_kv_blocks=16, max_num_seqs=2, num_threads=1)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on, read from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.read().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: TCP_LISTEN
                    address, port = cols[1].split(":")
                    found.add((_address(address), int(port, 16)))
    return found


def _address(hexaddr: str) -> str:
    """/proc/net/tcp's hex address (little-endian words) as text: 127.0.0.1, 0.0.0.0, :: ..."""
    if len(hexaddr) == 8:
        return ".".join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    words = [hexaddr[i:i + 8] for i in range(0, 32, 8)]
    raw = b"".join(bytes.fromhex(w)[::-1] for w in words)
    import ipaddress

    return str(ipaddress.IPv6Address(raw))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tp_security"), "llama_gqa")[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/net/tcp"), reason="reads /proc/<pid>/net/tcp (Linux)")
def test_every_listener_of_driver_and_worker_is_on_loopback_and_close_releases_the_drivers(model_dir):
    before = listening(os.getpid())
    llm = LLM(model_dir, tensor_parallel_size=2, **SMALL)
    try:
        (worker,) = llm.llm_engine.runner.worker_pids()
        assert llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        opened = listening(os.getpid()) - before
        assert opened, "the driver serves the rendezvous store: it must listen somewhere"
        for pid, sockets in ((os.getpid(), opened), (worker, listening(worker))):
            exposed = sorted(s for s in sockets if s[0] != "127.0.0.1")
            assert not exposed, f"process {pid} listens beyond loopback on {exposed}"
        llm.close()
        assert listening(os.getpid()) - before == set(), \
            "close() must close the store and gloo listeners now, not at garbage collection"
    finally:
        llm.close()


def test_a_worker_killed_between_calls_raises_worker_error_naming_its_rank(model_dir):
    llm = LLM(model_dir, tensor_parallel_size=2, **SMALL)
    try:
        (pid,) = llm.llm_engine.runner.worker_pids()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:  # dead (a zombie): its pipe is closed
            time.sleep(0.05)
        assert not alive(pid)
        with pytest.raises(WorkerError, match="rank 1"):
            llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
        assert not llm.llm_engine.has_unfinished_requests()
    finally:
        llm.close()


SCRIPT = """
    from minirunner import LLM, SamplingParams
    llm = LLM({model!r}, tensor_parallel_size=2, device="cpu", num_kv_blocks=16, num_threads=1)
    print("ROMEO", llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=2),
                                use_tqdm=False)[0].outputs[0].token_ids)
"""


def _run_script(path, body: str):
    path.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=path.parent, env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_a_script_without_the_main_guard_fails_at_once_in_the_driver_saying_to_add_it(model_dir, tmp_path):
    run = _run_script(tmp_path / "unguarded.py", SCRIPT.format(model=str(model_dir)))
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError") and 'if __name__ == "__main__":' in last, run.stderr[-2000:]
    assert "bootstrapping phase" not in run.stderr  # no worker was started to die of it


def test_the_same_script_with_the_main_guard_runs(model_dir, tmp_path):
    guarded = "if __name__ == '__main__':\n" + textwrap.indent(textwrap.dedent(
        SCRIPT.format(model=str(model_dir))), "    ")
    run = _run_script(tmp_path / "guarded.py", guarded)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ROMEO [" in run.stdout

"""The CPU's C decode kernel (kernels/paged_decode_cpu.c) against its torch twin ``paged_decode_ref``:
called directly, through the ``minirunner::paged_decode_cpu`` operator inside a compiled graph, on
narrowed (strided) block tables; its build (a real compiler, ``CC`` as a word list, a failed or hung
build, a stale temporary file), the folders it refuses, the outcome kept per folder, and bad block ids."""

from __future__ import annotations

import logging
import shlex
import shutil
import subprocess
import sys

import pytest
import torch

from minirunner.attention.torch_ops import paged_decode_cpu as paged_decode_op
from minirunner.kernels import paged_decode_cpu as cpu_kernel
from minirunner.kernels.paged_attention import paged_decode_ref
from minirunner.kernels.testing import random_paged_batch

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")),
                                reason="no C compiler to build the kernel with")

# (block_size, head_dim, num_q_heads, num_kv_heads, seq_lens): lengths across the kernel's 64-key
# chunks (63, 64, 65, 200), block boundaries, 1, and padding rows (0); GQA groups 1, 2, 3 and 8.
CASES = [
    (16, 64, 2, 2, [17, 16, 1, 0, 33]),
    (16, 64, 8, 2, [200, 64, 65, 63, 0]),
    (1, 32, 4, 4, [5, 1, 0, 130]),
    (32, 128, 8, 1, [97, 1]),
    (16, 64, 6, 2, [20, 1, 129]),
]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    assert cpu_kernel.load(tmp_path_factory.mktemp("kernels")), "the kernel did not build with this compiler"


@pytest.mark.parametrize("block_size,head_dim,hq,hkv,seq_lens", CASES)
def test_cpu_kernel_matches_twin(kernel, block_size, head_dim, hq, hkv, seq_lens):
    b = random_paged_batch(seq_lens, [1 if s else 0 for s in seq_lens], hq, hkv, head_dim, block_size,
                           seed=block_size + head_dim)
    q = torch.randn(len(seq_lens), hq, head_dim)
    scale = head_dim**-0.5
    assert cpu_kernel.supports(q, b.kv_cache, b.block_tables, b.seq_lens)
    got = cpu_kernel.paged_decode_cpu(q, b.kv_cache, b.block_tables, b.seq_lens, scale)
    want = paged_decode_ref(q, b.kv_cache, b.block_tables, b.seq_lens, scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.all(got[b.seq_lens == 0] == 0)


def test_cpu_kernel_reads_a_narrowed_table_and_stops_at_its_width(kernel):
    """A compiled step's tables are the first columns of wider static tables (a strided view): the kernel
    reads the row stride, and never a key beyond the columns it was given."""
    seq_lens = [40, 100, 7]
    b = random_paged_batch(seq_lens, [1, 1, 1], 4, 2, 64, 16, seed=3)
    wide = torch.cat([b.block_tables, torch.full((3, 5), 10_000, dtype=torch.int32)], dim=1)
    columns = 4  # 64 tokens: the second sequence is cut to its first 64 keys
    narrow = wide[:, :columns]
    assert narrow.stride(0) != columns
    q = torch.randn(3, 4, 64)
    got = cpu_kernel.paged_decode_cpu(q, b.kv_cache, narrow, b.seq_lens, 0.125)
    want = paged_decode_ref(q, b.kv_cache, narrow.contiguous(), b.seq_lens.clamp(max=columns * 16), 0.125)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_operator_in_a_compiled_graph_matches_twin(kernel):
    seq_lens = [70, 3, 0, 31]
    b = random_paged_batch(seq_lens, [1, 1, 0, 1], 4, 2, 32, 8, seed=5)
    q = torch.randn(4, 4, 32)

    def step(q, kv, tables, lens):
        return paged_decode_op(q * 2, kv, tables, lens, 0.5) + 1

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    want = paged_decode_ref(q * 2, b.kv_cache, b.block_tables, b.seq_lens, 0.5) + 1
    torch.testing.assert_close(compiled(q, b.kv_cache, b.block_tables, b.seq_lens), want,
                               atol=1e-5, rtol=1e-5)


def test_supports_only_what_the_kernel_reads():
    b = random_paged_batch([5, 9], [1, 1], 2, 2, 16, 4)
    q = torch.randn(2, 2, 16)
    assert cpu_kernel.supports(q, b.kv_cache, b.block_tables, b.seq_lens)
    assert not cpu_kernel.supports(q.bfloat16(), b.kv_cache.bfloat16(), b.block_tables, b.seq_lens)
    assert not cpu_kernel.supports(q, b.kv_cache, b.block_tables.long(), b.seq_lens)
    assert not cpu_kernel.supports(q, b.kv_cache, b.block_tables, b.seq_lens.long())
    assert not cpu_kernel.supports(q, b.kv_cache.transpose(0, 1), b.block_tables, b.seq_lens)


def _files(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_no_working_compiler_builds_nothing_and_leaves_no_temporary_file(tmp_path, monkeypatch, caplog):
    """Where the compiler fails, nothing half-built is left behind, the caller is told (False) and a
    WARNING says why, so a compiled step keeps torch's form."""
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger="minirunner"):
        assert not cpu_kernel.load(tmp_path / "k")
    assert _files(tmp_path / "k") == []
    assert any("CPU decode kernel is not used" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


def test_a_hung_compiler_is_stopped_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(600)'")
    assert not cpu_kernel.load(tmp_path / "k", timeout_s=1.0)
    assert _files(tmp_path / "k") == []


def test_cc_is_split_like_a_shell_word_list(tmp_path, monkeypatch, kernel):
    """``CC="env LC_ALL=C gcc"``: a wrapper and its arguments before the compiler (as ``ccache gcc``)."""
    cc = next(c for c in ("cc", "gcc", "clang") if shutil.which(c))
    monkeypatch.setenv("CC", f"env LC_ALL=C {cc}")
    assert cpu_kernel.compiler() == ["env", "LC_ALL=C", cc]
    assert cpu_kernel.load(tmp_path / "k")
    assert [n for n in _files(tmp_path / "k") if n.endswith(".so")]


def test_a_folder_others_can_write_is_refused(tmp_path, caplog):
    """A library is loaded only from a folder of this user that group and others cannot write: a
    writable one could hold a planted ``.so`` under the predictable name."""
    for mode, who in ((0o777, "others"), (0o775, "its group")):
        folder = tmp_path / f"open{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        with caplog.at_level(logging.WARNING, logger="minirunner"):
            assert not cpu_kernel.load(folder)
        assert _files(folder) == []  # nothing built there, nothing loaded
        assert any(f"writable by {who}" in r.getMessage() and str(folder) in r.getMessage()
                   for r in caplog.records)


def test_the_outcome_is_kept_per_folder(tmp_path, kernel):
    """Two folders in one process, two outcomes, whichever comes first."""
    open_folder, own_folder = tmp_path / "open", tmp_path / "own"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    assert not cpu_kernel.load(open_folder)
    assert cpu_kernel.load(own_folder)
    assert not cpu_kernel.load(open_folder)
    assert own_folder.stat().st_mode & 0o777 == 0o700  # the folder the kernel made is private


def test_a_temporary_file_of_a_killed_build_is_removed_by_the_next(tmp_path, kernel):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that no longer exists, as one killed mid-build
    folder = tmp_path / "k"
    folder.mkdir(mode=0o700)
    stale = folder / f"{cpu_kernel.TMP_PREFIX}0123.{gone.pid}.abc{cpu_kernel.TMP_SUFFIX}"
    stale.write_bytes(b"half a library")
    assert cpu_kernel.load(folder)
    assert not stale.exists()
    assert all(n.endswith(".so") for n in _files(folder))


@pytest.mark.parametrize("bad_id", [-1, 40])
def test_a_bad_block_id_raises_naming_it(kernel, bad_id):
    """A block table pointing outside the cache raises IndexError naming the id, instead of reading
    memory outside the cache; a padding row (length 0) reads no block, whatever its table holds."""
    b = random_paged_batch([20, 33, 0], [1, 1, 0], 4, 2, 32, 16, seed=7)
    assert b.kv_cache.shape[0] <= 40
    tables = b.block_tables.clone()
    tables[2, :] = -5  # the padding row: never read
    q = torch.randn(3, 4, 32)
    cpu_kernel.paged_decode_cpu(q, b.kv_cache, tables, b.seq_lens, 0.5)  # fine as it is
    tables[1, 2] = bad_id  # the third block of sequence 1 (33 tokens read 3 blocks)
    with pytest.raises(IndexError, match=f"sequence 1 reads block id {bad_id} \\(column 2"):
        cpu_kernel.paged_decode_cpu(q, b.kv_cache, tables, b.seq_lens, 0.5)
    with pytest.raises(IndexError, match=f"block id {bad_id}"):  # through the operator a graph calls
        paged_decode_op(q, b.kv_cache, tables, b.seq_lens, 0.5)

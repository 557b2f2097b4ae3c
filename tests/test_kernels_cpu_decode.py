"""The CPU's C decode kernel (kernels/paged_decode_cpu.c) against its torch twin ``paged_decode_ref``:
called directly, through the ``minirunner::paged_decode_cpu`` operator inside a compiled graph, on
narrowed (strided) block tables, and its build where no compiler works."""

from __future__ import annotations

import shutil

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


def test_no_working_compiler_builds_nothing(tmp_path, monkeypatch):
    """Where the compiler fails, nothing half-built is left behind and the caller is told (None), so a
    compiled step keeps torch's form."""
    monkeypatch.setenv("CC", "false")
    assert cpu_kernel._build(tmp_path) is None  # noqa: SLF001 (the build itself, not the once-per-process cache)
    assert list(tmp_path.iterdir()) == []

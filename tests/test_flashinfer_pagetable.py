"""FlashInfer's CSR page table built from our block tables: checked on CPU against the block-table
semantics (rebuild each sequence's K/V from the CSR form, compare with the block-table gather)."""

from __future__ import annotations

import pytest
import torch

from minirunner.attention.flashinfer_pagetable import block_tables_to_csr
from minirunner.kernels.testing import random_paged_batch


def _kv_from_csr(kv_cache, indptr, indices, last_page_len, i):
    """Sequence i's K/V as FlashInfer reads it: its pages in order, the last one cut."""
    page_size = kv_cache.shape[2]
    pages = indices[indptr[i]:indptr[i + 1]].long()
    kv = kv_cache[pages].permute(1, 0, 2, 3, 4).reshape(2, -1, *kv_cache.shape[3:])
    n = (len(pages) - 1) * page_size + int(last_page_len[i]) if len(pages) else 0
    return kv[:, :n]


def _kv_from_block_table(kv_cache, block_table, seq_len):
    """The same through our convention: slot of position p = table[p // B] * B + p % B."""
    page_size = kv_cache.shape[2]
    pos = torch.arange(seq_len)
    blocks = block_table[pos // page_size].long()
    return kv_cache[blocks, :, pos % page_size].permute(1, 0, 2, 3)


@pytest.mark.parametrize("page_size,seq_lens", [
    (16, [17, 16, 1, 0, 33]), (1, [3, 1, 0]), (32, [64, 31, 0, 0, 1]), (4, [0])])
def test_csr_rebuilds_each_sequence(page_size, seq_lens):
    b = random_paged_batch(seq_lens, [0] * len(seq_lens), 2, 2, 8, page_size)
    indptr, indices, last = block_tables_to_csr(b.block_tables, b.seq_lens, page_size)
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr.shape == (len(seq_lens) + 1,) and last.shape == (len(seq_lens),)
    assert int(indptr[0]) == 0 and torch.all(indptr[1:] >= indptr[:-1])
    assert indices.shape == (int(indptr[-1]),)
    assert torch.all((last >= 1) & (last <= page_size))
    for i, s in enumerate(seq_lens):
        num_pages = int(indptr[i + 1] - indptr[i])
        assert num_pages == -(-s // page_size)
        if s:
            assert (num_pages - 1) * page_size + int(last[i]) == s
        got = _kv_from_csr(b.kv_cache, indptr, indices, last, i)
        want = _kv_from_block_table(b.kv_cache, b.block_tables[i], s)
        assert torch.equal(got, want)


def test_csr_rejects_a_too_short_block_table():
    with pytest.raises(ValueError, match="more pages"):
        block_tables_to_csr(torch.zeros(1, 2, dtype=torch.int32), torch.tensor([33]), 16)


def test_flashinfer_backend_explains_when_unavailable():
    """Without flashinfer (or without CUDA) choosing the backend is a clear ValueError."""
    pytest.importorskip("triton")
    from minirunner.attention import get_backend_class

    cls = get_backend_class("flashinfer")
    try:
        import flashinfer  # noqa: F401
        has_flashinfer = True
    except ImportError:
        has_flashinfer = False
    if has_flashinfer and torch.cuda.is_available():
        pytest.skip("flashinfer and CUDA are both present: the backend is usable here")
    with pytest.raises(ValueError, match="flashinfer|CUDA"):
        cls(4, 2, 64, 0.125, 16, torch.device("cpu"), torch.float16)

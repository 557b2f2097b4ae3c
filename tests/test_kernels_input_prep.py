"""prepare_inputs: the Triton gather (interpreter on CPU) against its torch twin and a worked example."""

from __future__ import annotations

import os

import pytest
import torch

from minirunner.kernels.input_prep import prepare_inputs, prepare_inputs_ref

# The Triton kernels run on CPU tensors only in the interpreter, which tests/conftest.py turns on when
# CUDA is absent; on a CUDA machine the gpu-marked tests cover the compiled kernels instead.
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="Triton on CPU tensors needs TRITON_INTERPRET=1")


def _buffers(max_tokens, max_seqs, max_blocks, fill=77):
    return dict(
        positions=torch.full((max_tokens,), fill, dtype=torch.int64),
        slot_mapping=torch.full((max_tokens,), fill, dtype=torch.int64),
        seq_lens=torch.full((max_seqs,), fill, dtype=torch.int32),
        query_start_loc=torch.full((max_seqs + 1,), fill, dtype=torch.int32),
        batch_block_tables=torch.full((max_seqs, max_blocks), fill, dtype=torch.int32),
    )


@needs_interpreter
@pytest.mark.parametrize("fn", [prepare_inputs, prepare_inputs_ref])
def test_worked_example(fn):
    """Three requests in state rows 3, 0, 5; block size 4; values worked out by hand."""
    num_computed = torch.tensor([0, 5, 3, 7, 0, 1], dtype=torch.int32)
    block_tables = torch.zeros(6, 3, dtype=torch.int32)
    block_tables[3] = torch.tensor([9, 6, 0])
    block_tables[0] = torch.tensor([44, 39, 2])
    block_tables[5] = torch.tensor([41, 8, 0])
    idx_mapping = torch.tensor([3, 0, 5], dtype=torch.int32)
    query_lens = torch.tensor([1, 6, 2], dtype=torch.int32)  # decode, prefill over 2 blocks, extend
    buf = _buffers(12, 4, 3)
    fn(idx_mapping, query_lens, num_computed, block_tables, 4, **buf)
    # row 3: position 7 -> block 6, offset 3 -> slot 27. row 0: positions 0..5 -> blocks 44, 39.
    # row 5: positions 1, 2 -> block 41. Then 3 padding token rows and one padding batch row.
    assert buf["positions"].tolist() == [7, 0, 1, 2, 3, 4, 5, 1, 2, 0, 0, 0]
    assert buf["slot_mapping"].tolist() == [27, 176, 177, 178, 179, 156, 157, 165, 166, -1, -1, -1]
    assert buf["seq_lens"].tolist() == [8, 6, 3, 0]
    assert buf["query_start_loc"].tolist() == [0, 1, 7, 9, 9]
    assert buf["batch_block_tables"].tolist() == [[9, 6, 0], [44, 39, 2], [41, 8, 0], [0, 0, 0]]


@needs_interpreter
@pytest.mark.parametrize("fn", [prepare_inputs, prepare_inputs_ref])
def test_graph_bucket_padding_rows(fn):
    """Two verify rows (3 tokens each) padded to a bucket of 4: the padding rows own 3 padding tokens
    each, so query_start_loc steps on by 3 to the bucket's end (a uniform graph step's 0, q, 2q, ...),
    with seq_len 0, block-table row 0, position 0 and slot -1."""
    num_computed = torch.tensor([5, 2], dtype=torch.int32)
    block_tables = torch.tensor([[7, 3], [4, 9]], dtype=torch.int32)
    buf = _buffers(12, 4, 2)
    fn(torch.tensor([1, 0], dtype=torch.int32), torch.tensor([3, 3], dtype=torch.int32), num_computed,
       block_tables, 4, **buf, pad_query_len=3)
    assert buf["query_start_loc"].tolist() == [0, 3, 6, 9, 12]
    assert buf["positions"].tolist() == [2, 3, 4, 5, 6, 7] + [0] * 6
    assert buf["slot_mapping"].tolist() == [18, 19, 36, 13, 14, 15] + [-1] * 6
    assert buf["seq_lens"].tolist() == [5, 8, 0, 0]
    assert buf["batch_block_tables"].tolist() == [[4, 9], [7, 3], [0, 0], [0, 0]]


@needs_interpreter
@pytest.mark.parametrize("block_size,num_reqs,max_seqs,pad_query_len",
                         [(1, 3, 4, 0), (16, 5, 8, 0), (32, 4, 4, 0), (16, 3, 8, 2), (4, 1, 4, 5)])
def test_matches_twin_on_random_state(block_size, num_reqs, max_seqs, pad_query_len):
    gen = torch.Generator().manual_seed(block_size)
    max_reqs, max_blocks = 10, 6
    rows = torch.randperm(max_reqs, generator=gen)[:num_reqs].to(torch.int32)
    query_lens = torch.randint(1, 2 * block_size + 3, (num_reqs,), generator=gen, dtype=torch.int32)
    capacity = max_blocks * block_size
    num_computed = torch.randint(0, capacity // 2, (max_reqs,), generator=gen, dtype=torch.int32)
    query_lens = torch.minimum(query_lens, capacity - num_computed[rows.long()])
    block_tables = torch.randint(0, 100, (max_reqs, max_blocks), generator=gen, dtype=torch.int32)
    max_tokens = int(query_lens.sum()) + 5
    got, want = _buffers(max_tokens, max_seqs, max_blocks), _buffers(max_tokens, max_seqs, max_blocks)
    prepare_inputs(rows, query_lens, num_computed, block_tables, block_size, **got,
                   pad_query_len=pad_query_len)
    prepare_inputs_ref(rows, query_lens, num_computed, block_tables, block_size, **want,
                       pad_query_len=pad_query_len)
    for name in got:
        assert torch.equal(got[name], want[name]), name
    # The slot of every real token lies in the block its position falls into.
    total = int(query_lens.sum())
    pos, slot = got["positions"][:total], got["slot_mapping"][:total]
    assert torch.all(slot % block_size == pos % block_size)
    assert torch.all(got["slot_mapping"][total:] == -1)
    pads = torch.arange(max_seqs - num_reqs + 1, dtype=torch.int32)
    assert torch.equal(got["query_start_loc"][num_reqs:], total + pads * pad_query_len)


@needs_interpreter
def test_empty_batch_pads_everything():
    for fn in (prepare_inputs, prepare_inputs_ref):
        buf = _buffers(4, 2, 3)
        fn(torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
           torch.zeros(3, dtype=torch.int32), torch.zeros(3, 3, dtype=torch.int32), 16, **buf)
        assert buf["slot_mapping"].tolist() == [-1] * 4
        assert buf["seq_lens"].tolist() == [0, 0]
        assert buf["query_start_loc"].tolist() == [0, 0, 0]


@needs_interpreter
def test_rejects_too_many_requests():
    buf = _buffers(8, 1, 2)
    with pytest.raises(ValueError, match="sequences"):
        prepare_inputs(torch.tensor([0, 1], dtype=torch.int32), torch.ones(2, dtype=torch.int32),
                       torch.zeros(2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), 4,
                       **buf)

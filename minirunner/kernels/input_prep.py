"""Per-step input preparation on the device (vLLM Model Runner V2 style): a gather from state rows.

Owns turning persistent per-request state (num_computed_tokens and block table rows, indexed by a stable
state row) plus this step's schedule (idx_mapping, query_lens, indexed by batch position) into the
attention inputs: positions, seq_lens, query_start_loc, slot_mapping and the batch's block tables,
written into preallocated buffers so a CUDA graph can keep their storage. Padding batch rows get
seq_len 0 and a block-table row of zeros, padding tokens position 0 and slot -1; a graph step's padding
rows may each own ``pad_query_len`` (padding) tokens, so query_start_loc steps on uniformly past the
batch. It never schedules, allocates blocks or advances state.
"""

from __future__ import annotations

import torch

from minirunner.kernels._triton import tl, triton


def _check(idx_mapping, query_lens, positions, slot_mapping, seq_lens, query_start_loc,
           batch_block_tables, block_tables):
    num_reqs = idx_mapping.shape[0]
    max_num_seqs = seq_lens.shape[0]
    if query_lens.shape[0] != num_reqs:
        raise ValueError("idx_mapping and query_lens must have one entry per scheduled request")
    if num_reqs > max_num_seqs or query_start_loc.shape[0] != max_num_seqs + 1:
        raise ValueError(f"buffers hold {max_num_seqs} sequences (query_start_loc needs "
                         f"{max_num_seqs + 1} entries); got {num_reqs} requests")
    if positions.shape[0] != slot_mapping.shape[0]:
        raise ValueError("positions and slot_mapping must be token buffers of the same length")
    if batch_block_tables is not None and (
            batch_block_tables.shape[0] != max_num_seqs
            or batch_block_tables.shape[1] != block_tables.shape[1]):
        raise ValueError("batch_block_tables must be [max_num_seqs, max_blocks_per_req]")


def prepare_inputs_ref(
    idx_mapping: torch.Tensor,
    query_lens: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    batch_block_tables: torch.Tensor | None = None,
    pad_query_len: int = 0,
) -> None:
    """Fill this step's attention inputs in place (torch twin of :func:`prepare_inputs`).

    Inputs, per batch position b < num_reqs: idx_mapping int32 [num_reqs] (b -> state row),
    query_lens int32 [num_reqs] (tokens scheduled for b this step). Per state row r:
    num_computed_tokens int32 [max_num_reqs] (tokens already in the KV cache), block_tables int32
    [max_num_reqs, max_blocks_per_req]. block_size: tokens per KV block.

    Outputs (preallocated, overwritten whole): positions int64 [max_num_tokens]; slot_mapping int64
    [max_num_tokens]; seq_lens int32 [max_num_seqs]; query_start_loc int32 [max_num_seqs + 1];
    batch_block_tables int32 [max_num_seqs, max_blocks_per_req] (optional; the rows of the batch).
    Request b's tokens are rows qsl[b]..qsl[b+1] at positions num_computed .. num_computed + q_len - 1,
    seq_lens[b] = num_computed + q_len and slot = block_table[pos // block_size] * block_size
    + pos % block_size. Batch rows b >= num_reqs are padding rows of ``pad_query_len`` tokens each:
    qsl[b] = total + (b - num_reqs) * pad_query_len (0: every one at total tokens; a uniform graph
    bucket of q tokens per row passes q, so qsl = 0, q, 2q, ... throughout), seq_len 0, block table row
    0. Token rows >= total: position 0, slot -1.
    """
    _check(idx_mapping, query_lens, positions, slot_mapping, seq_lens, query_start_loc,
           batch_block_tables, block_tables)
    num_reqs = idx_mapping.shape[0]
    rows = idx_mapping.long()
    q_lens = query_lens.long()
    starts = torch.zeros(num_reqs + 1, dtype=torch.int64, device=q_lens.device)
    starts[1:] = q_lens.cumsum(0)
    total = starts[-1]
    computed = num_computed_tokens.long()[rows]

    query_start_loc[:num_reqs] = starts[:num_reqs].to(query_start_loc.dtype)
    pads = torch.arange(query_start_loc.shape[0] - num_reqs, device=query_start_loc.device)
    query_start_loc[num_reqs:] = (total + pads * pad_query_len).to(query_start_loc.dtype)
    seq_lens.zero_()
    seq_lens[:num_reqs] = (computed + q_lens).to(seq_lens.dtype)

    token_ids = torch.arange(positions.shape[0], device=positions.device)
    req_of_token = torch.searchsorted(starts[1:], token_ids, right=True).clamp(max=max(num_reqs - 1, 0))
    valid = token_ids < total
    if num_reqs == 0:
        valid = torch.zeros_like(valid)
        pos = torch.zeros_like(token_ids)
        slot = torch.full_like(token_ids, -1)
    else:
        pos = computed[req_of_token] + token_ids - starts[req_of_token]
        pos = torch.where(valid, pos, torch.zeros_like(pos))
        block = block_tables.long()[rows[req_of_token], pos // block_size]
        slot = torch.where(valid, block * block_size + pos % block_size, torch.full_like(pos, -1))
    positions.copy_(pos)
    slot_mapping.copy_(slot)
    if batch_block_tables is not None:
        batch_block_tables.zero_()
        batch_block_tables[:num_reqs] = block_tables[rows]


@triton.jit
def _prepare_inputs_kernel(
    idx_mapping_ptr, query_lens_ptr, num_computed_ptr, block_tables_ptr,
    positions_ptr, slot_mapping_ptr, seq_lens_ptr, query_start_loc_ptr, batch_block_tables_ptr,
    num_reqs, max_num_seqs, max_num_tokens, max_blocks, stride_bt, stride_bbt, pad_query_len,
    BLOCK_SIZE: tl.constexpr, REQS_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_B: tl.constexpr, GATHER_TABLES: tl.constexpr,
):
    b = tl.program_id(0)
    # Each program sums the query lengths before it: O(num_reqs) loads, no cross-program ordering.
    offs_r = tl.arange(0, REQS_PAD)
    q_lens = tl.load(query_lens_ptr + offs_r, mask=offs_r < num_reqs, other=0)
    start = tl.sum(tl.where(offs_r < b, q_lens, 0), axis=0)
    total = tl.sum(q_lens, axis=0)
    offs_t = tl.arange(0, BLOCK_T)
    offs_b = tl.arange(0, BLOCK_B)
    if b < num_reqs:
        row = tl.load(idx_mapping_ptr + b).to(tl.int64)
        q_len = tl.load(query_lens_ptr + b)
        computed = tl.load(num_computed_ptr + row)
        tl.store(query_start_loc_ptr + b, start)
        tl.store(seq_lens_ptr + b, computed + q_len)
        for t0 in range(0, q_len, BLOCK_T):
            i = t0 + offs_t
            m = i < q_len
            pos = (computed + i).to(tl.int64)
            block = tl.load(block_tables_ptr + row * stride_bt + pos // BLOCK_SIZE, mask=m, other=0)
            slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
            tl.store(positions_ptr + start + i, pos, mask=m)
            tl.store(slot_mapping_ptr + start + i, slot, mask=m)
        if GATHER_TABLES:
            for c0 in range(0, max_blocks, BLOCK_B):
                c = c0 + offs_b
                blocks = tl.load(block_tables_ptr + row * stride_bt + c, mask=c < max_blocks)
                tl.store(batch_block_tables_ptr + b * stride_bbt + c, blocks, mask=c < max_blocks)
    elif b < max_num_seqs:
        tl.store(query_start_loc_ptr + b, total + (b - num_reqs) * pad_query_len)
        tl.store(seq_lens_ptr + b, 0)
        if GATHER_TABLES:
            for c0 in range(0, max_blocks, BLOCK_B):
                c = c0 + offs_b
                tl.store(batch_block_tables_ptr + b * stride_bbt + c,
                         tl.zeros([BLOCK_B], tl.int32), mask=c < max_blocks)
    else:
        # The last program closes query_start_loc and pads the token tail.
        tl.store(query_start_loc_ptr + max_num_seqs, total + (max_num_seqs - num_reqs) * pad_query_len)
        for t0 in range(total, max_num_tokens, BLOCK_T):
            i = t0 + offs_t
            m = i < max_num_tokens
            tl.store(positions_ptr + i, tl.zeros([BLOCK_T], tl.int64), mask=m)
            tl.store(slot_mapping_ptr + i, tl.full([BLOCK_T], -1, tl.int64), mask=m)


def prepare_inputs(
    idx_mapping: torch.Tensor,
    query_lens: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    batch_block_tables: torch.Tensor | None = None,
    pad_query_len: int = 0,
) -> None:
    """Triton version of :func:`prepare_inputs_ref` (same arguments, shapes, dtypes and results).

    One program per batch row (max_num_seqs of them) plus one that pads the token tail; no host sync.
    Output dtypes are fixed: positions/slot_mapping int64, seq_lens/query_start_loc/tables int32.
    """
    _check(idx_mapping, query_lens, positions, slot_mapping, seq_lens, query_start_loc,
           batch_block_tables, block_tables)
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if t.dtype != torch.int64:
            raise ValueError(f"{name} must be int64, got {t.dtype}")
    for name, t in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc),
                    ("block_tables", block_tables)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {t.dtype}")
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous in its last dimension")
    num_reqs = idx_mapping.shape[0]
    max_num_seqs = seq_lens.shape[0]
    gather = batch_block_tables is not None
    bbt = batch_block_tables if gather else seq_lens
    _prepare_inputs_kernel[(max_num_seqs + 1,)](
        idx_mapping, query_lens, num_computed_tokens, block_tables,
        positions, slot_mapping, seq_lens, query_start_loc, bbt,
        num_reqs, max_num_seqs, positions.shape[0], block_tables.shape[1],
        block_tables.stride(0), bbt.stride(0) if gather else 0, pad_query_len,
        BLOCK_SIZE=block_size, REQS_PAD=triton.next_power_of_2(max(max_num_seqs, 1)), BLOCK_T=128,
        BLOCK_B=128, GATHER_TABLES=gather,
    )

"""Capacity before rooflines: the batch whose KV fits beside the weights (simulators/kv_memory.py), the
arithmetic notebook 02 teaches and notebooks 04, 06 and 07 cap their batch curves with."""

from __future__ import annotations

import pytest

from simulators.kv_memory import (
    H200_BYTES,
    LLAMA_3_8B,
    OPT_13B,
    kv_bytes_per_token,
    kv_token_slots,
    max_batch,
    min_tp,
)

GiB = 2**30


def test_the_papers_budget_in_slots():
    # vLLM paper, Table 1 / section 3: OPT-13B keeps about 12 GB of an A100-40GB for KV, 800 KiB a token
    assert kv_token_slots(12 * GiB, 0, kv_bytes_per_token(OPT_13B)) == 15_728


def test_an_8b_model_on_one_h200_holds_a_few_hundred_4k_requests_not_512():
    kv = kv_bytes_per_token(LLAMA_3_8B)  # 128 KiB per token in bf16
    fits = max_batch(H200_BYTES, 16e9, kv, 4096)
    # by hand: (139.8 GiB - 16 GB) / (4096 x 128 KiB) = 249.7
    assert fits == 249
    assert max_batch(H200_BYTES, 16e9, kv, 4096) < 512 <= max_batch(H200_BYTES, 16e9, kv, 1024)
    # the batch that fits really fits, one more does not
    assert fits * 4096 * kv + 16e9 <= H200_BYTES < (fits + 1) * 4096 * kv + 16e9


def test_a_70b_model_needs_two_h200s():
    kv = 2 * 80 * 8 * 128 * 2  # Llama-3-70B, bf16
    assert max_batch(H200_BYTES, 140e9, kv, 4096) < 8  # the weights fit, eight 4k requests do not
    assert min_tp(H200_BYTES, 140e9, kv, 4096, batch=32) == 2
    assert max_batch(H200_BYTES, 140e9, kv, 4096, tp=2) >= 32
    assert max_batch(H200_BYTES, 200e9, kv, 1) == 0  # weights larger than the device: nothing fits


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="context"):
        max_batch(H200_BYTES, 1e9, 1000, 0)
    with pytest.raises(ValueError, match="tp"):
        kv_token_slots(H200_BYTES, 1e9, 1000, tp=0)

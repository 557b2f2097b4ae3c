"""ModelRunner's input preparation: the draft's chained decode pass (prepare_next_decode) builds the same
step as the full prepare_inputs would, and runs the same forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_model

from minirunner.attention import get_backend_class
from minirunner.config import ModelConfig
from minirunner.engine.request import Request
from minirunner.engine.scheduler import ScheduledRequest
from minirunner.engine.step_data import WorkerRowsSent
from minirunner.kv.manager import KVCacheManager
from minirunner.model.loader import load_model
from minirunner.sampling_params import SamplingParams
from minirunner.worker.model_runner import ModelRunner

BLOCK = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("inputs"), "qwen3")
    mc = ModelConfig.from_dir(path)
    return load_model(path, mc, torch.float32, torch.device("cpu")), mc


def _runner(model):
    model, mc = model
    backend = get_backend_class("torch")(mc.num_q_heads, mc.num_kv_heads, mc.head_dim,
                                         mc.head_dim ** -0.5, BLOCK, torch.device("cpu"),
                                         torch.float32)
    return ModelRunner(model, backend, 64, BLOCK, 8, 256, 128), KVCacheManager(64, BLOCK, False)


def _step(runner, kv, requests, sent, chain=None):
    scheduled = []
    for r in requests:
        n = r.num_tokens - r.num_computed_tokens
        assert kv.allocate(r, n)
        scheduled.append(ScheduledRequest(r, n))
    logits, inputs = runner.forward_logits(sent.build(scheduled, kv.table), chain)
    for s in scheduled:
        s.request.num_computed_tokens += s.num_new_tokens
    return logits, inputs


def _snapshot(inputs):
    """Everything a forward and the sampler read of a step, as host arrays."""
    m = inputs.meta
    n = m.num_seqs
    cols = -(-m.max_seq_len // BLOCK)
    return dict(ids=inputs.input_ids.numpy().copy(), positions=m.positions.numpy().copy(),
                slots=m.slot_mapping.numpy().copy(), qsl=m.query_start_loc.numpy().copy(),
                seq_lens=m.seq_lens.numpy().copy(), tables=m.block_tables[:n, :cols].numpy().copy(),
                tables_cpu=m.block_tables_cpu.numpy().copy(),
                logits_rows=inputs.logits_indices.numpy().copy(),
                sample_positions=inputs.sample_positions.numpy().copy(),
                rows=inputs.sample_rows.copy(), max_seq_len=m.max_seq_len, max_query_len=m.max_query_len)


@pytest.mark.parametrize("prompt_lens", [[3], [1, 4, 7, 2], [8, 5, 12]])
def test_chained_decode_pass_equals_a_full_prepare(model, prompt_lens):
    """Requests of ragged lengths, several passes in a row, each crossing block boundaries at its own
    step: the chained pass (tokens device to device) and prepare_inputs (tokens from the host) give the
    same buffers and the same logits."""
    runs = []
    for chained in (False, True):
        runner, kv = _runner(model)
        sent = WorkerRowsSent()
        g = torch.Generator().manual_seed(3)
        requests = [Request(f"r{i}", torch.randint(3, 90, (n,), generator=g).tolist(),
                            SamplingParams(temperature=0.0, max_tokens=20), seed=0, max_len=40)
                    for i, n in enumerate(prompt_lens)]
        logits, inputs = _step(runner, kv, requests, sent)
        snaps, all_logits = [], []
        for _ in range(6):
            tokens = logits.argmax(dim=-1)
            for r, t in zip(requests, tokens.tolist(), strict=True):
                r.append_token(t)
            logits, inputs = _step(runner, kv, requests, sent, (inputs, tokens) if chained else None)
            snaps.append(_snapshot(inputs))
            all_logits.append(logits.clone())
        runs.append((snaps, all_logits, [r.output_token_ids for r in requests]))
    (full, full_logits, full_tokens), (chain, chain_logits, chain_tokens) = runs
    assert chain_tokens == full_tokens
    for a, b in zip(full, chain, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert np.array_equal(a[key], b[key]), key
    for a, b in zip(full_logits, chain_logits, strict=True):
        assert torch.equal(a, b)

"""The decode roofline with the KV term (simulators/roofline.py), by hand, and notebook 04's roofline
exercises: each checker accepts the reference and rejects known-wrong answers."""

from __future__ import annotations

import math

import pytest

from simulators.exercises import NotImplementedYet
from simulators.hinted_exercises import hinted
from simulators.kv_memory import QWEN3_0_6B, kv_bytes_per_token
from simulators.roofline import (
    DecodeModel,
    attention_intensity,
    floors_us,
    make_floor_exercise,
    make_floor_task,
    saturation_batch,
    step_bytes,
)

# Qwen3-0.6B's config.json: 28 layers, 16 query heads, 8 KV heads, head_dim 128, bf16
QWEN = DecodeModel("Qwen3-0.6B", 0.6e9, 2, 28, 16, 128, kv_bytes_per_token(QWEN3_0_6B))


def test_kv_bytes_by_hand_and_the_issue_s_example():
    assert QWEN.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
    # batch 32 at 4k contexts: 32 x 4096 x 114688 bytes of KV, 15 GB against 1.2 GB of weights
    assert step_bytes(QWEN, 32, 4096) - QWEN.weight_bytes == 32 * 4096 * 114688
    assert 15e9 < step_bytes(QWEN, 32, 4096, kv=True) - step_bytes(QWEN, 32, 4096, kv=False) < 15.1e9
    mem, comp = floors_us(QWEN, 1, 0, 4.8e12, 989e12)
    assert mem == pytest.approx(1.2e9 / 4.8e12 * 1e6) and comp == pytest.approx(1.2e9 / 989e12 * 1e6)


def test_saturation_batch_without_kv_is_the_ridge_times_bytes_per_param_over_two():
    assert saturation_batch(QWEN, 4096, 4.8e12, 989e12, kv=False) == pytest.approx(989 / 4.8)
    # with the KV term the bytes grow with the batch faster than the FLOPs: never compute-bound
    assert saturation_batch(QWEN, 4096, 4.8e12, 989e12) == math.inf
    # attention alone: 2 x 16 / 8 / 2 bytes = 2 FLOPs per byte at any context (and any batch)
    assert attention_intensity(QWEN, 128) == attention_intensity(QWEN, 4096) == 2.0


@pytest.mark.parametrize("seed", range(6))
def test_floor_exercise_accepts_the_answer_and_names_the_missing_kv(seed):
    ex = make_floor_exercise(seed)
    assert ex.check(ex.solution()).correct and not ex.check(None).answered
    weights_only = float(ex.question.split("A ")[1].split("B-")[0]) * 2e9
    bw = 4.8e12 if "H200" in ex.question else 3.35e12
    verdict = ex.check(weights_only / bw * 1e6)
    assert not verdict.correct and "KV" in verdict.why
    assert not ex.check(ex.solution() * 2).correct


def _floor(params, bytes_per_param, kv_bytes_per_token, batch, context, bandwidth, peak, flops_per_token):
    mem = (params * bytes_per_param + batch * context * kv_bytes_per_token) / bandwidth
    comp = flops_per_token * batch / peak
    return (max(mem, comp) * 1e6, "compute" if comp > mem else "bandwidth")


def test_floor_task_accepts_the_rule_and_rejects_wrong_ones():
    task = hinted(make_floor_task())
    assert task.check(_floor).correct

    def stub(**kw):
        raise NotImplementedYet

    pending = task.check(stub)
    assert not pending.answered and "Hint" not in str(pending)
    wrong = {
        "no KV": lambda **c: _floor(**{**c, "kv_bytes_per_token": 0}),
        "bytes floor only": lambda **c: (_floor(**{**c, "peak": 1e30})[0], "bandwidth"),
        "seconds": lambda **c: (_floor(**c)[0] / 1e6, _floor(**c)[1]),
        "KV once, not per sequence": lambda **c: _floor(
            **{**c, "kv_bytes_per_token": c["kv_bytes_per_token"] / max(c["batch"], 1)}),
    }
    for name, fn in wrong.items():
        verdict = task.check(lambda _fn=fn, **c: _fn(**c))
        assert verdict.answered and not verdict.correct, name
        assert "Hint:" in verdict.why

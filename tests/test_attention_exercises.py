"""Notebook 08's exercises and implement-its: every checker accepts two valid alternatives, rejects at
least three committed wrong solutions with a reason, says "not implemented yet" / "not answered yet" to an
untouched cell and gives its hint only after a wrong attempt (the numpy mechanisms themselves:
tests/test_attention_simulator.py)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from attention_twins import twin_head, twin_paged

from simulators.attention import merge_partials, paged_decode_grouped
from simulators.attention_exercises import (
    WRITTEN,
    instructor_rubric,
    make_merge_exercise,
    make_order_exercise,
    make_regime_exercise,
    merge_task,
    online_softmax_task,
    paged_gqa_task,
    written_question,
)
from simulators.exercises import NotImplementedYet

SEEDS = range(20)


# --- online softmax: two valid alternatives and five wrong ones --------------------------------------

def online_update(state, q, k, v, scale):
    m, l_sum, acc = state if state is not None else (-math.inf, 0.0, np.zeros(len(q)))
    s = k @ q * scale
    m_new = max(m, s.max())
    alpha = math.exp(m - m_new)
    p = np.exp(s - m_new)
    return m_new, l_sum * alpha + p.sum(), acc * alpha + p @ v


def online_update_base2(state, q, k, v, scale):
    """The Triton kernel's form: scores in base 2 (scale x log2 e), exp2, the max kept in base 2."""
    m, l_sum, acc = state if state is not None else (-np.inf, 0.0, np.zeros(len(q)))
    s = k @ q * (scale * math.log2(math.e))
    m_new = max(m, s.max())
    p = np.exp2(s - m_new)
    alpha = np.exp2(m - m_new)
    return m_new, l_sum * alpha + p.sum(), acc * alpha + p @ v


def online_update_key_by_key(state, q, k, v, scale):
    """One key at a time inside the chunk (the chunk is a loop of size-1 online updates)."""
    for i in range(len(k)):
        s = float(k[i] @ q) * scale
        if state is None:
            state = (s, 1.0, v[i].astype(float).copy())
            continue
        m, l_sum, acc = state
        m_new = max(m, s)
        a, b = math.exp(m - m_new), math.exp(s - m_new)
        state = (m_new, l_sum * a + b, acc * a + b * v[i])
    return state


def wrong_no_rescale(state, q, k, v, scale):
    m, l_sum, acc = state if state is not None else (-math.inf, 0.0, np.zeros(len(q)))
    s = k @ q * scale
    m_new = max(m, s.max())
    p = np.exp(s - m_new)
    return m_new, l_sum + p.sum(), acc + p @ v  # old sums still relative to the old max


def wrong_rescale_l_only(state, q, k, v, scale):
    m, l_sum, acc = state if state is not None else (-math.inf, 0.0, np.zeros(len(q)))
    s = k @ q * scale
    m_new = max(m, s.max())
    alpha = math.exp(m - m_new)
    p = np.exp(s - m_new)
    return m_new, l_sum * alpha + p.sum(), acc + p @ v


def wrong_chunk_max(state, q, k, v, scale):
    """The running max replaced by this chunk's max (a falling max overflows the rescale)."""
    m, l_sum, acc = state if state is not None else (-math.inf, 0.0, np.zeros(len(q)))
    s = k @ q * scale
    m_new = s.max()
    with np.errstate(over="ignore"):
        alpha = np.exp(m - m_new)
    p = np.exp(s - m_new)
    return m_new, l_sum * alpha + p.sum(), acc * alpha + p @ v


def wrong_max_starts_at_zero(state, q, k, v, scale):
    m, l_sum, acc = state if state is not None else (0.0, 0.0, np.zeros(len(q)))
    s = k @ q * scale
    m_new = max(m, s.max())
    alpha = math.exp(m - m_new)
    p = np.exp(s - m_new)
    return m_new, l_sum * alpha + p.sum(), acc * alpha + p @ v


def wrong_keeps_all_scores(state, q, k, v, scale):
    """Right numbers, but the state keeps every key and value seen: it grows with the sequence."""
    seen = np.concatenate([state[2], np.c_[k, v].ravel()]) if state is not None else np.c_[k, v].ravel()
    return 0.0, 1.0, seen


# --- the merge -------------------------------------------------------------------------------------

def merge_logsumexp(parts):
    lse = np.array([p[1] for p in parts])
    m = lse.max()
    w = np.exp(lse - m)
    return sum(wi * o for wi, (o, _) in zip(w, parts, strict=True)) / w.sum()


def merge_pairwise(parts):
    """FlashInfer's merge_state, folded over the splits two at a time."""
    o, lse = parts[0]
    for o2, lse2 in parts[1:]:
        new = np.logaddexp(lse, lse2)
        if new == -np.inf:
            continue
        o = np.exp(lse - new) * o + np.exp(lse2 - new) * o2
        lse = new
    return o


def wrong_mean(parts):
    return np.mean([o for o, _ in parts], axis=0)


def wrong_no_max_subtraction(parts):
    with np.errstate(all="ignore"):
        w = np.exp([lse for _, lse in parts])
        return sum(wi * o for wi, (o, _) in zip(w, parts, strict=True)) / w.sum()


def wrong_linear_weights(parts):
    lse = np.array([p[1] if np.isfinite(p[1]) else 0.0 for p in parts])
    return sum(wi * o for wi, (o, _) in zip(lse, parts, strict=True)) / lse.sum()


def wrong_unnormalised(parts):
    lse = np.array([p[1] for p in parts])
    w = np.exp(lse - lse.max())
    return sum(wi * o for wi, (o, _) in zip(w, parts, strict=True))


# --- the paged read with GQA -----------------------------------------------------------------------

def gqa_by_group(q, kv, block_table, seq_len, scale):
    return paged_decode_grouped(q, kv, block_table, seq_len, scale)


def gqa_streaming(q, kv, block_table, seq_len, scale):
    """Block by block, an online softmax per KV head, its group's rows together."""
    hq, _ = q.shape
    g = hq // kv.num_kv_heads
    out = np.zeros_like(q)
    for h in range(kv.num_kv_heads):
        rows = q[h * g:(h + 1) * g]
        m, l_sum, acc = np.full(g, -np.inf), np.zeros(g), np.zeros_like(rows)
        for j in range(-(-seq_len // kv.block_size)):
            k, v = kv.read(block_table[j], h)
            n = min(kv.block_size, seq_len - j * kv.block_size)
            s = rows @ k[:n].T * scale
            m_new = np.maximum(m, s.max(1))
            a = np.exp(m - m_new)
            p = np.exp(s - m_new[:, None])
            l_sum, acc, m = l_sum * a + p.sum(1), acc * a[:, None] + p @ v[:n], m_new
        out[h * g:(h + 1) * g] = acc / l_sum[:, None]
    return out


def _attend(qh, k, v, scale):
    s = k @ qh * scale
    p = np.exp(s - s.max())
    return p / p.sum() @ v


def _gather(kv, block_table, n_blocks, h):
    ks, vs = zip(*(kv.read(block_table[j], h) for j in range(n_blocks)), strict=True)
    return np.concatenate(ks), np.concatenate(vs)


def wrong_head_mapping(q, kv, block_table, seq_len, scale):
    hq = q.shape[0]
    nb = -(-seq_len // kv.block_size)
    kvs = [_gather(kv, block_table, nb, h) for h in range(kv.num_kv_heads)]
    wrong = [kvs[i % kv.num_kv_heads] for i in range(hq)]  # heads dealt round-robin, not in groups
    return np.stack([_attend(q[i], wrong[i][0][:seq_len], wrong[i][1][:seq_len], scale) for i in range(hq)])


def wrong_drops_partial_block(q, kv, block_table, seq_len, scale):
    hq = q.shape[0]
    g = hq // kv.num_kv_heads
    nb = max(seq_len // kv.block_size, 1)  # off by one: the partial last block is never read
    kvs = [_gather(kv, block_table, nb, h) for h in range(kv.num_kv_heads)]
    return np.stack([_attend(q[i], kvs[i // g][0][:seq_len], kvs[i // g][1][:seq_len], scale)
                     for i in range(hq)])


def wrong_keeps_stale_tail(q, kv, block_table, seq_len, scale):
    hq = q.shape[0]
    g = hq // kv.num_kv_heads
    nb = -(-seq_len // kv.block_size)
    kvs = [_gather(kv, block_table, nb, h) for h in range(kv.num_kv_heads)]
    return np.stack([_attend(q[i], kvs[i // g][0], kvs[i // g][1], scale) for i in range(hq)])  # whole blocks


def wrong_read_per_query_head(q, kv, block_table, seq_len, scale):
    """Right numbers, the 2023 kernel's traffic: every query head reads its KV head's blocks again."""
    hq = q.shape[0]
    g = hq // kv.num_kv_heads
    nb = -(-seq_len // kv.block_size)
    out = []
    for i in range(hq):
        k, v = _gather(kv, block_table, nb, i // g)
        out.append(_attend(q[i], k[:seq_len], v[:seq_len], scale))
    return np.stack(out)


def wrong_block_table_shifted(q, kv, block_table, seq_len, scale):
    return paged_decode_grouped(q, kv, block_table[1:], seq_len, scale)  # off by one column


TASKS = {
    "online": (lambda: online_softmax_task(twin_head),
               [online_update, online_update_base2, online_update_key_by_key],
               [wrong_no_rescale, wrong_rescale_l_only, wrong_chunk_max, wrong_max_starts_at_zero,
                wrong_keeps_all_scores]),
    "merge": (lambda: merge_task(twin_head), [merge_logsumexp, merge_pairwise, merge_partials],
              [wrong_mean, wrong_no_max_subtraction, wrong_linear_weights, wrong_unnormalised]),
    "gqa": (lambda: paged_gqa_task(twin_paged), [gqa_by_group, gqa_streaming],
            [wrong_head_mapping, wrong_drops_partial_block, wrong_keeps_stale_tail, wrong_read_per_query_head,
             wrong_block_table_shifted]),
}


@pytest.mark.parametrize("name", TASKS)
def test_each_checker_accepts_the_valid_alternatives(name):
    make, valid, _ = TASKS[name]
    for fn in valid:
        verdict = make().check(fn)
        assert verdict.correct, f"{fn.__name__}: {verdict}"


@pytest.mark.parametrize("name", TASKS)
def test_each_checker_rejects_every_committed_wrong_solution_with_a_hint(name):
    make, _, wrong = TASKS[name]
    assert len(wrong) >= 3
    for fn in wrong:
        verdict = make().check(fn)
        assert verdict.answered and not verdict.correct, fn.__name__
        assert "Hint:" in str(verdict), fn.__name__


def test_the_online_checker_names_the_overflow_and_the_missing_rescale():
    task = online_softmax_task(twin_head)
    assert "peaked" in task.check(wrong_chunk_max).why and "not finite" in task.check(wrong_chunk_max).why
    assert "-900" in task.check(wrong_max_starts_at_zero).why
    assert "random" in task.check(wrong_rescale_l_only).why and "random" in task.check(wrong_no_rescale).why
    assert "grows" in task.check(wrong_keeps_all_scores).why


def test_the_gqa_checker_counts_reads():
    verdict = paged_gqa_task(twin_paged).check(wrong_read_per_query_head)
    assert "reads" in verdict.why and "right output" in verdict.why


@pytest.mark.parametrize("make", [lambda: online_softmax_task(twin_head), lambda: merge_task(twin_head),
                                  lambda: paged_gqa_task(twin_paged)])
def test_an_untouched_stub_is_not_implemented_yet_and_gets_no_method(make):
    def stub(*args):
        raise NotImplementedYet

    verdict = make().check(stub)
    assert not verdict.answered and str(verdict).startswith("not implemented yet")
    assert "Hint" not in str(verdict) and "exp" not in str(verdict) and "//" not in str(verdict)


# --- the exercises ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_merge_exercise(seed):
    ex = make_merge_exercise(seed)
    nums = [float(x) for x in re.findall(r"= (-?\d+\.?\d*)", ex.question)]
    o1, lse1, o2, lse2 = nums[:4]
    want = (math.exp(lse1) * o1 + math.exp(lse2) * o2) / (math.exp(lse1) + math.exp(lse2))
    assert ex.solution() == pytest.approx(want, abs=1e-3)
    # the numpy merge agrees with the exercise's arithmetic
    assert merge_partials([(np.array([o1]), lse1), (np.array([o2]), lse2)])[0] == pytest.approx(want)
    assert ex.check(ex.solution()).correct and not ex.check(None).answered
    mean = (o1 + o2) / 2
    if abs(mean - want) > 0.01:
        wrong = ex.check(mean)
        assert not wrong.correct and "mean" in wrong.why and "Hint:" in wrong.why
    assert "e^" not in str(ex.check(None)) and "lse" not in str(ex.check(None))


@pytest.mark.parametrize("make", [make_order_exercise, make_regime_exercise])
@pytest.mark.parametrize("seed", SEEDS)
def test_choice_exercises_have_options_of_equal_weight_and_hints_after_a_wrong_answer(make, seed):
    ex = make(seed)
    assert ex.check(ex.solution()).correct and ex.check(ex.solution().upper()).correct
    options = [line[4:] for line in ex.question.splitlines() if line[:1] == "(" and line[2:4] == ") "]
    lengths = [len(o) for o in options]
    assert len(options) == 3 and max(lengths) <= 1.25 * min(lengths), options
    assert all(":" in o for o in options)
    wrong = [ex.check(c) for c in "abc" if c != ex.solution()]
    assert not any(w.correct for w in wrong) and wrong[0].why != wrong[1].why
    assert all("Hint:" in w.why for w in wrong)
    assert "Hint" not in str(ex.check(None)) and not ex.check(None).answered and not ex.check("d").correct


def test_the_regime_exercise_asks_each_regime():
    asked = {make_regime_exercise(s).question[:60] for s in range(40)}
    assert len(asked) == 3


def test_the_figures_in_the_options_hold():
    assert 2 * 8 * 128 * 2 * 80 == 320 * 1024 and 320 * 1024 * 32768 == 10 * 2**30
    assert 64 * 4096 * 2 * 8 * 128 * 2 * 40 == 40 * 2**30 and 2 * 8 * 128 * 2 * 40 == 160 * 1024
    assert round(64 * 32 / 132) == 16 and 2048 / 132 > 15


def test_written_questions_show_no_rubric():
    for name in WRITTEN:
        prompt = written_question(name)
        assert prompt.startswith("Run, vary, explain")
        rubric = instructor_rubric(name)
        assert len(rubric) >= 3 and all(point not in prompt for point in rubric)
        assert sum(int(p.split(" pts")[0]) for p in rubric) == 10

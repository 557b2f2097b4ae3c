"""Tests of simulators.kv_memory: KV bytes per token, workloads, and the allocator simulation."""

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from simulators.kv_allocator import POLICY_ROWS, simulate_allocator
from simulators.kv_exercises import make_exercise, make_fit_exercise, make_slot_exercise
from simulators.kv_memory import (
    ALPACA_LIKE,
    LLAMA_3_8B,
    OPT_13B,
    QWEN3_0_6B,
    SHAREGPT_LIKE,
    Workload,
    blocks_needed,
    buddy_reservation,
    kv_bytes_per_token,
    next_pow2,
    paged_slack,
    sample_workload,
)


def test_opt_13b_matches_the_paper():
    # PagedAttention paper, section 3: 2 (K and V) x 5120 hidden x 40 layers x 2 bytes = 800 KB
    assert kv_bytes_per_token(OPT_13B) == 2 * 5120 * 40 * 2 == 800 * 1024


def test_gqa_and_explicit_head_dim():
    assert kv_bytes_per_token(LLAMA_3_8B) == 2 * 32 * 8 * 128 * 2  # 8 KV heads of 32
    # Qwen3-0.6B: head_dim is 128 although hidden/heads = 64
    assert kv_bytes_per_token(QWEN3_0_6B) == 2 * 28 * 8 * 128 * 2
    assert kv_bytes_per_token(QWEN3_0_6B, dtype="float32") == 2 * 28 * 8 * 128 * 4


def test_transformers_config_objects_give_the_same_numbers():
    opt = transformers.OPTConfig(hidden_size=5120, num_attention_heads=40, num_hidden_layers=40,
                                 ffn_dim=20480, dtype="float16")
    qwen = transformers.Qwen3Config(hidden_size=1024, num_attention_heads=16, head_dim=128,
                                    num_key_value_heads=8, num_hidden_layers=28, dtype="bfloat16")
    assert kv_bytes_per_token(opt) == kv_bytes_per_token(OPT_13B)
    assert kv_bytes_per_token(qwen) == kv_bytes_per_token(QWEN3_0_6B)


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="dtype"):
        kv_bytes_per_token({**OPT_13B, "torch_dtype": "float12"})


def test_reservation_waste_hand_computed():
    # budget 10 slots, max_model_len 5: requests (prompt, output) = (2, 1), (1, 2), (4, 1).
    # step 0: r0 and r1 each reserve 5 slots; r2 waits. tokens 2+1, still to come 1+2,
    #   never used (5-3)+(5-3).  step 1: tokens 3+2, to come 0+1, never used 2+2.
    # step 2: r0 has finished, r2 is admitted, nobody waits: not a saturated step.
    w = Workload("hand", (2, 1, 4), (1, 2, 1), max_model_len=5)
    r = simulate_allocator(w, 10, "max_model_len")
    assert r.num_saturated_steps == 2
    assert r.token_share == pytest.approx((3 + 5) / 20)
    assert r.reservation_share == pytest.approx((3 + 1) / 20)
    assert r.internal_share == pytest.approx((4 + 4) / 20)
    assert r.external_share == 0
    assert r.mean_running == 2


def test_oracle_reservation_has_no_internal_waste_but_reserves_the_future():
    w = Workload("hand", (3, 3), (4, 4), max_model_len=16)
    r = simulate_allocator(w, 8, "max_tokens", max_tokens="oracle")
    # one request of 7 slots fits at a time: step 0 holds 3 tokens, reserves 4 more, 1 slot free
    assert r.num_saturated_steps == 5  # steps 0..4, until the first request finishes
    assert r.internal_share == 0
    assert r.token_share == pytest.approx(sum(range(3, 8)) / 40)
    assert r.external_share == pytest.approx(1 / 8)


def test_buddy_rounding():
    assert next_pow2(120) == 128 and next_pow2(64) == 64 and next_pow2(1) == 1
    assert buddy_reservation(100, 20, 2048) == 128
    assert buddy_reservation(1500, 600, 2048) == 2048  # never past max_model_len
    with pytest.raises(ValueError):
        next_pow2(0)


def test_the_papers_pow2_over_reserves_the_output_then_rounds():
    # prompt 7, output 25: Pow2 asks for 32 output slots (25 -> 32), 7 + 32 = 39 -> 64 (buddy);
    # Oracle + buddy rounds 7 + 25 = 32 -> 32; exact Oracle reserves 32 as well
    w = Workload("hand", (7, 7), (25, 25), max_model_len=2048)
    budget = 100
    pow2 = simulate_allocator(w, budget, "max_tokens", max_tokens="pow2")
    buddy = simulate_allocator(w, budget, "max_tokens", max_tokens="oracle_buddy")
    # 64 + 64 > 100: Pow2 serves one at a time; 32 + 32 <= 100: both run together, half the steps
    assert (pow2.max_running, pow2.num_steps, buddy.num_steps) == (1, 52, 26)
    w2 = Workload("hand", (7,), (26,), max_model_len=2048)  # 33 -> 64 under both buddy modes
    three = Workload("hand", (7, 7, 7), (26, 26, 26), 2048)
    exact = simulate_allocator(three, 100, "max_tokens")
    assert exact.num_steps == 27  # 3 x 33 = 99 slots: all three run at once
    assert simulate_allocator(three, 100, "max_tokens", max_tokens="oracle_buddy").num_steps == 3 * 27
    with pytest.raises(ValueError, match="max_tokens"):
        simulate_allocator(w2, budget, "max_tokens", max_tokens="buddy")


def test_layout_shows_first_fit_placement_and_holes():
    # 3 requests of 4 slots each (max_model_len 4) in 10 slots: two fit at 0 and 4, 2 slots left
    w = Workload("hand", (1, 1, 1), (3, 3, 3), max_model_len=4)
    r = simulate_allocator(w, 10, "max_model_len", layout_step=0)
    assert [(start, n) for start, n, _tok, _rid in r.layout] == [(0, 4), (4, 4)]
    assert [tok for _s, _n, tok, _r in r.layout] == [1, 1]


@settings(max_examples=200, deadline=None)
@given(num_tokens=st.integers(1, 100_000), block_size=st.integers(1, 512))
def test_paged_waste_per_request_is_below_one_block(num_tokens, block_size):
    slack = paged_slack(num_tokens, block_size)
    assert 0 <= slack < block_size
    assert blocks_needed(num_tokens, block_size) * block_size >= num_tokens


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 2, 4, 8, 16, 32]),
       budget_blocks=st.integers(130, 400))
def test_paged_simulation_never_holds_a_full_unused_block(seed, block_size, budget_blocks):
    w = sample_workload(ALPACA_LIKE, 60, seed)
    w = Workload(w.name, tuple(min(p, 64) for p in w.prompt_lens),
                 tuple(min(o, 64) for o in w.output_lens), 128)
    r = simulate_allocator(w, budget_blocks * block_size, "paged", block_size=block_size)
    assert r.max_slack_per_request < block_size
    total = r.token_share + r.reservation_share + r.internal_share + r.external_share
    assert total == pytest.approx(1.0) or r.num_saturated_steps == 0


def test_paging_holds_more_token_states_and_more_requests_than_reservation():
    w = sample_workload(SHAREGPT_LIKE, 300, seed=1)
    budget = 8192
    reserve = simulate_allocator(w, budget, "max_model_len")
    paged = simulate_allocator(w, budget, "paged", block_size=16)
    assert reserve.mean_running == budget // 2048  # exactly 4 max_model_len reservations fit
    assert paged.token_share > 2 * reserve.token_share
    assert paged.mean_running > 2 * reserve.mean_running


def test_workloads_are_seeded_and_have_the_stated_means():
    a = sample_workload(SHAREGPT_LIKE, 20_000, seed=3)
    assert a == sample_workload(SHAREGPT_LIKE, 20_000, seed=3)
    assert a != sample_workload(SHAREGPT_LIKE, 20_000, seed=4)
    mean_prompt = sum(a.prompt_lens) / len(a)
    mean_output = sum(a.output_lens) / len(a)
    assert abs(mean_prompt / SHAREGPT_LIKE.prompt_mean - 1) < 0.05
    assert abs(mean_output / SHAREGPT_LIKE.output_mean - 1) < 0.10  # outputs are cut at 2048
    assert max(p + o for p, o in zip(a.prompt_lens, a.output_lens, strict=True)) <= 2048


def test_a_request_larger_than_the_budget_is_rejected():
    w = Workload("big", (100,), (10,), max_model_len=2048)
    with pytest.raises(ValueError, match="budget"):
        simulate_allocator(w, 1024, "max_model_len")


def test_exercise_checkers():
    for seed in range(20):
        ex = make_exercise(seed)
        answer = ex.solution()
        assert ex.check(answer).correct
        verdict = ex.check(answer // 2)
        assert not verdict.correct and "factor 2" in verdict.why
        assert not ex.check(None).answered
        fp8 = make_exercise(seed, dtype="float8")
        assert "torch_dtype=float8" in fp8.question and fp8.check(fp8.solution()).correct
        slot = make_slot_exercise(seed)
        assert slot.check(slot.solution()).correct
        assert not slot.check(slot.solution() + 1).correct
        fit = make_fit_exercise(seed)
        assert fit.check(fit.solution()).correct and not fit.check(fit.solution() + 1).correct


def test_every_slot_exercise_hint_can_fire():
    # each wrong-answer branch of the slot checker is reachable (none is dead code)
    seen = set()
    for seed in range(60):
        ex = make_slot_exercise(seed)
        bs = int(ex.question.split("block_size = ")[1].split(",")[0])
        table = eval(ex.question.split("block_table = ")[1].split(".\n")[0])  # a list literal
        pos = int(ex.question.split("position ")[1].rstrip("?"))
        logical, offset = divmod(pos, bs)
        for wrong, key in ((pos, "logical position"), (table[logical], "physical block;"),
                           (table[logical] * bs, "first slot"),
                           (table[logical - 1] * bs + offset, "neighbouring")):
            if wrong == ex.solution():
                continue
            why = ex.check(wrong).why
            if key in why:
                seen.add(key)
    assert seen == {"logical position", "physical block;", "first slot", "neighbouring"}


def test_fp8_halves_the_bytes_of_fp16():
    for seed in range(10):
        assert make_exercise(seed, "float8").solution() * 2 == make_exercise(seed, "float16").solution()
    with pytest.raises(ValueError, match="dtype"):
        make_exercise(0, dtype="int4")


def test_max_external_waste_is_the_leftover_of_whole_reservations():
    w = sample_workload(SHAREGPT_LIKE, 300, seed=2)
    r = simulate_allocator(w, 15_728, "max_model_len")
    assert r.mean_running == 7 and r.max_running == 7
    assert r.external_share == pytest.approx((15_728 - 7 * 2048) / 15_728)


def test_cli_compare_and_exercises(capsys):
    from simulators.kv_memory import main

    main(["compare", "-n", "200", "--budget", "8192"])
    out = capsys.readouterr().out
    for row in POLICY_ROWS:
        assert row in out
    ex = make_fit_exercise(4)
    main(["fit", "-s", "4", "-c"])
    out = capsys.readouterr().out
    assert ex.question in out and f"ANSWER {ex.solution()}" in out
    main(["bytes", "-s", "4"])
    assert "ANSWER" not in capsys.readouterr().out
    for seed in range(10):  # each exercise's command prints its question and, with -c, its solution
        for ex in (make_exercise(seed), make_exercise(seed, "float8"), make_fit_exercise(seed)):
            main(ex.command.split()[3:] + ["-c"])
            out = capsys.readouterr().out
            assert ex.question in out and out.strip().endswith(f"ANSWER {ex.solution()}")
    with pytest.raises(SystemExit):
        main(["compare", "-n", "0"])

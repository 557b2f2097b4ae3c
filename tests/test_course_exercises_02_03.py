"""Notebooks 02 and 03's implement-it tasks and exercise set-up: each checker accepts the runner's own
function (the reference the notebooks pass in) and an independent correct answer, rejects the usual
wrong ones with the case that shows it, and calls an untouched stub "not implemented yet"."""

import math

import pytest

from minirunner.kv.block_table import BlockTable
from simulators.block_exercises import slot_mapping_cases, slot_mapping_task
from simulators.exercises import NotImplementedYet
from simulators.kv_exercises import blocks_needed_cases, blocks_needed_task, make_exercise, random_config


def runner_blocks_needed(num_tokens, block_size):
    """What notebook 02 passes in: a fresh request's table asked for room for num_tokens."""
    return BlockTable(block_size).blocks_needed(num_tokens)


def runner_slot_mapping(block_table, block_size, start, end):
    """What notebook 03 passes in: the runner's BlockTable.slots over that table."""
    table = BlockTable(block_size)
    table.blocks = list(block_table)
    return table.slots(start, end).tolist()


def _stub(**_):
    raise NotImplementedYet


# -- 02: blocks_needed --------------------------------------------------------------------------

def test_blocks_needed_accepts_the_runner_and_a_ceiling_division():
    task = blocks_needed_task(runner_blocks_needed)
    assert task.check(runner_blocks_needed).correct
    assert task.check(lambda num_tokens, block_size: math.ceil(num_tokens / block_size)).correct


@pytest.mark.parametrize("wrong, shows", [
    (lambda num_tokens, block_size: num_tokens // block_size, "got 0, expected 1"),        # floor
    (lambda num_tokens, block_size: num_tokens // block_size + 1, "got 1, expected 0"),    # one too many at 0
    (lambda num_tokens, block_size: round(num_tokens / block_size), "expected"),           # rounds to nearest
    (lambda num_tokens, block_size: num_tokens, "expected"),                               # slots, not blocks
])
def test_blocks_needed_rejects_known_wrong_answers(wrong, shows):
    verdict = blocks_needed_task(runner_blocks_needed).check(wrong)
    assert verdict.answered and not verdict.correct
    assert shows in verdict.why


def test_blocks_needed_cases_hit_the_edges_for_every_seed():
    for seed in range(5):
        cases = blocks_needed_cases(seed)
        for b in {c["block_size"] for c in cases}:
            lengths = {c["num_tokens"] for c in cases if c["block_size"] == b}
            assert {0, 1, b, b + 1} <= lengths
    # 16 and 17 tokens at block 16: the boundary a floor or an off-by-one gets wrong
    assert [runner_blocks_needed(n, 16) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]


def test_blocks_needed_stub_is_not_implemented_yet():
    verdict = blocks_needed_task(runner_blocks_needed).check(_stub)
    assert not verdict.answered and "not implemented yet" in str(verdict)
    assert not str(verdict).startswith("wrong")


# -- 02: exercise 8.2 is 8.1's model with an FP8 cache ------------------------------------------

def test_fp8_exercise_keeps_the_model_and_changes_only_the_cache_dtype():
    for seed in range(40):
        plain, fp8 = random_config(seed), random_config(seed, "float8")
        assert {k: v for k, v in plain.items() if k != "torch_dtype"} == \
               {k: v for k, v in fp8.items() if k != "torch_dtype"}
    # notebook 02 uses seed 2 (a bfloat16 model): the FP8 cache takes half the bytes per token
    assert random_config(2)["torch_dtype"] == "bfloat16"
    assert make_exercise(2, dtype="float8").solution() * 2 == make_exercise(2).solution()


# -- 03: slot_mapping ---------------------------------------------------------------------------

def test_slot_mapping_accepts_the_runner_and_an_independent_answer():
    task = slot_mapping_task(runner_slot_mapping)
    assert task.check(runner_slot_mapping).correct

    def by_hand(block_table, block_size, start, end):
        out = []
        for pos in range(start, end):
            logical, offset = divmod(pos, block_size)
            out.append(block_table[logical] * block_size + offset)
        return out

    assert task.check(by_hand).correct


@pytest.mark.parametrize("wrong", [
    lambda block_table, block_size, start, end: list(range(start, end)),                    # no table
    lambda block_table, block_size, start, end: [block_table[p // block_size] * block_size
                                                 for p in range(start, end)],               # no offset
    lambda block_table, block_size, start, end: [block_table[p // block_size] + p % block_size
                                                 for p in range(start, end)],               # no x block_size
    lambda block_table, block_size, start, end: [block_table[p // block_size] * block_size + p % block_size
                                                 for p in range(0, end - start)],  # from 0, not start
])
def test_slot_mapping_rejects_known_wrong_answers(wrong):
    verdict = slot_mapping_task(runner_slot_mapping).check(wrong)
    assert verdict.answered and not verdict.correct
    assert verdict.why.startswith("case ") and "expected" in verdict.why


def test_slot_mapping_cases_cross_blocks_and_start_mid_block():
    cases = slot_mapping_cases(0)
    assert any(c["end"] - c["start"] == 1 for c in cases)  # a decode token
    assert any(c["start"] % c["block_size"] and c["block_size"] > 1 for c in cases)
    assert any(c["start"] // c["block_size"] != (c["end"] - 1) // c["block_size"] for c in cases)
    assert all(c["end"] <= len(c["block_table"]) * c["block_size"] for c in cases)


def test_slot_mapping_stub_is_not_implemented_yet():
    verdict = slot_mapping_task(runner_slot_mapping).check(_stub)
    assert not verdict.answered and "not implemented yet" in str(verdict)
    assert not str(verdict).startswith("wrong")

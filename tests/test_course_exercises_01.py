"""Notebook 01's exercises and implement-it task: each checker accepts a right answer (worked out here,
not read from the checker) and rejects the typical wrong ones with a reason; an untouched stub is
"not implemented yet", never "wrong"."""

import re

import pytest

from simulators.exercises import NotImplementedYet
from simulators.paging import array_walk_vpns, simulate_policy
from simulators.paging_exercises import (
    make_belady_exercise,
    make_exercise,
    make_page_size_exercise,
    make_policy_exercise,
    make_tlb_exercise,
    make_translate_task,
)

# --- implement it: translate(vaddr, page_table, page_size) ---------------------------------------


def student_translate(vaddr, page_table, page_size):
    """A right answer, as a student writes it."""
    vpn, offset = divmod(vaddr, page_size)
    pte = page_table[vpn]
    if not pte >> 31:
        return None
    return (pte & 0x7FFFFFFF) * page_size + offset


def keeps_the_valid_bit(vaddr, page_table, page_size):
    vpn, offset = divmod(vaddr, page_size)
    return page_table[vpn] * page_size + offset if page_table[vpn] else None


def ignores_the_valid_bit(vaddr, page_table, page_size):
    vpn, offset = divmod(vaddr, page_size)
    return (page_table[vpn] & 0x7FFFFFFF) * page_size + offset


def assumes_4k_pages(vaddr, page_table, page_size):
    return student_translate(vaddr, page_table, 4096) if vaddr >> 12 < len(page_table) else None


def drops_the_offset(vaddr, page_table, page_size):
    pte = page_table[vaddr // page_size]
    return (pte & 0x7FFFFFFF) * page_size if pte else None


def adds_the_offset_to_the_pfn(vaddr, page_table, page_size):
    pte = page_table[vaddr // page_size]
    return (pte & 0x7FFFFFFF) + vaddr % page_size if pte else None


@pytest.mark.parametrize("seed", range(6))
def test_translate_task_accepts_a_right_implementation(seed):
    task = make_translate_task(seed)
    verdict = task.check(student_translate)
    assert verdict.correct, verdict.why
    # the cases cover what the wrong ones get wrong: invalid pages and page sizes other than 4 KiB
    assert any(student_translate(**c) is None for c in task.cases)
    assert len({c["page_size"] for c in task.cases}) >= 3


@pytest.mark.parametrize("wrong", [keeps_the_valid_bit, ignores_the_valid_bit, assumes_4k_pages,
                                   drops_the_offset, adds_the_offset_to_the_pfn],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("seed", range(3))
def test_translate_task_rejects_known_wrong_implementations(seed, wrong):
    verdict = make_translate_task(seed).check(wrong)
    assert verdict.answered and not verdict.correct
    assert re.search(r"case \d+ \(vaddr=0x", verdict.why) and "expected" in verdict.why


def test_an_untouched_stub_is_not_implemented_yet_with_a_hint():
    def translate(vaddr, page_table, page_size):
        raise NotImplementedYet

    verdict = make_translate_task(0).check(translate)
    assert not verdict.answered and "not implemented yet" in str(verdict)
    assert "page_size" in verdict.why and "wrong" not in str(verdict)


# --- explain: page size and the table's size -----------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_page_size_exercise_accepts_the_reason_and_rejects_the_others(seed):
    ex = make_page_size_exercise(seed)
    sizes = {"1k": 1024, "2k": 2048, "4k": 4096}
    small, big = re.findall(r"-P (\dk)", ex.question)
    asize = int(re.search(r"-a (\d)m", ex.question).group(1)) << 20
    assert f"prints {asize // sizes[small]} entries" in ex.question  # entries = space / page size
    assert f"prints {asize // sizes[big]}." in ex.question
    choices = dict(re.findall(r"\(([a-d])\) (.*)", ex.question))
    right = [k for k, text in choices.items() if "fewer entries cover" in text]
    assert len(right) == 1
    assert ex.check(right[0]).correct and ex.check(f"({right[0].upper()})").correct
    wrongs = [k for k in choices if k != right[0]]
    assert len(wrongs) == 3
    reasons = {ex.check(k).why for k in wrongs}
    assert not any(ex.check(k).correct for k in wrongs) and len(reasons) == 3
    assert not ex.check("e").correct and not ex.check(3).correct
    assert not ex.check(None).answered


# --- compute and predict: the exercises already in the notebook ----------------------------------


def test_translate_exercise_rejects_a_wrong_frame_and_a_wrong_offset():
    for seed in range(20):
        ex = make_exercise(seed)
        va = int(re.search(r"virtual address (0x[0-9a-f]+)", ex.question).group(1), 16)
        vpn, offset = divmod(va, 4096)
        entry = re.search(rf"VPN +{vpn}: (.*)", ex.question).group(1)
        if entry.startswith("valid, present, PFN"):
            right = int(entry.split()[-1]) * 4096 + offset
            wrongs = [right ^ 0x10, int(entry.split()[-1]) + offset, va]
        else:
            right = "segfault" if entry == "invalid" else "page fault"
            wrongs = ["page fault" if right == "segfault" else "segfault", offset]
        assert ex.check(right).correct
        for w in wrongs:
            if w != right:
                assert not ex.check(w).correct, (seed, w)


def test_tlb_exercise_rejects_the_miss_count_and_counting_pages():
    for seed in range(10):
        ex = make_tlb_exercise(seed)
        count, size, base, passes, page, entries = (int(x) for x in re.search(
            r"reads (\d+) (\d+)-byte integers starting at virtual address (\d+), (\d) time.*"
            r"Pages are (\d+) bytes; the TLB has (\d+) entries", ex.question, re.S).groups())
        vpns = array_walk_vpns(base, size, count, page) * passes
        lru, hits = [], 0  # an LRU TLB, simulated here
        for v in vpns:
            if v in lru:
                hits += 1
                lru.remove(v)
            elif len(lru) == entries:
                lru.pop(0)
            lru.append(v)
        assert ex.check(hits).correct
        assert not ex.check(len(vpns) - hits).correct or hits * 2 == len(vpns)
        assert not ex.check(len(set(vpns))).correct or len(set(vpns)) == hits


def test_policy_exercise_rejects_all_misses_and_a_flipped_letter():
    for seed in range(8):
        ex = make_policy_exercise(seed)
        right = ex.solution()
        assert ex.check(right.upper()).correct
        assert not ex.check("m" * len(right)).correct or "h" not in right
        flipped = ("h" if right[-1] == "m" else "m")
        assert not ex.check(right[:-1] + flipped).correct


def test_belady_exercise_rejects_a_stack_algorithm_answer():
    ex = make_belady_exercise(0)
    trace = [int(x) for x in re.search(r"Trace ([\d ]+),", ex.question).group(1).split()]
    fifo = tuple(simulate_policy(trace, f, "FIFO").num_misses for f in (3, 4))
    assert fifo[1] > fifo[0] and ex.check(fifo).correct
    assert not ex.check((fifo[0], fifo[0] - 1)).correct  # "more frames, fewer misses"
    assert not ex.check((fifo[1], fifo[0])).correct

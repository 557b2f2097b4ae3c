"""Tests of simulators.paging: hand-worked translations, table equivalence, TLB and policies."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulators.paging import (
    SWAPPED,
    LinearPageTable,
    TwoLevelPageTable,
    array_walk_vpns,
    linear_table_bytes,
    main,
    multilevel_table_bytes,
    simulate_policy,
    simulate_tlb,
    split_address,
)
from simulators.paging_exercises import make_exercise
from simulators.paging_problems import random_linear_problem

# 4 KiB pages; VPN 0 -> PFN 3, VPN 1 invalid, VPN 2 -> PFN 7, VPN 3 -> PFN 0
HAND_TABLE = LinearPageTable(4096, (3, None, 7, 0))


def test_hand_worked_translations():
    t = HAND_TABLE.translate(0x2ABC)  # VPN 2, offset 0xABC
    assert (t.vpn, t.offset, t.pfn, t.paddr) == (2, 0xABC, 7, 0x7ABC)
    assert HAND_TABLE.translate(0x0000).paddr == 0x3000
    assert HAND_TABLE.translate(0x3FFF).paddr == 0x0FFF
    assert HAND_TABLE.translate(0x1000).fault
    assert HAND_TABLE.translate(0x1FFF).paddr is None


def test_split_address_keeps_low_bits_as_offset():
    assert split_address(0x3229, 4096) == (3, 0x229)
    assert split_address(100, 16) == (6, 4)
    with pytest.raises(ValueError):
        split_address(100, 24)  # not a power of two


def test_address_outside_space_is_an_error():
    with pytest.raises(ValueError):
        HAND_TABLE.translate(4 * 4096)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), page_bits=st.integers(4, 12), extra_bits=st.integers(1, 5),
       used=st.integers(0, 100))
def test_valid_pages_translate_and_invalid_pages_fault(seed, page_bits, extra_bits, used):
    page = 1 << page_bits
    problem = random_linear_problem(seed, page << extra_bits, page << (extra_bits + 1), page,
                                    20, used)
    for vaddr in problem.addresses:
        t = problem.table.translate(vaddr)
        pfn = problem.table.entries[vaddr // page]
        if pfn is None:
            assert t.fault and t.paddr is None
        else:
            assert t.paddr == pfn * page + vaddr % page


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), page_bits=st.integers(4, 10), extra_bits=st.integers(1, 8),
       pte_size=st.sampled_from([4, 8, 16]), used=st.integers(0, 100))
def test_two_level_walk_matches_linear_table(seed, page_bits, extra_bits, pte_size, used):
    page = 1 << page_bits
    asize = page << extra_bits
    problem = random_linear_problem(seed, asize, asize * 2, page, 0, used)
    linear = LinearPageTable(page, problem.table.entries, pte_size)
    two = TwoLevelPageTable.from_linear(linear)
    for vaddr in range(0, asize, max(1, asize // 97)):
        a, b = linear.translate(vaddr), two.translate(vaddr)
        assert (a.fault, a.paddr) == (b.fault, b.paddr)


def test_two_level_table_saves_memory_for_a_sparse_space():
    # 16 KiB pages of 64 entries (pte 4 B, page 256 B): only VPN 0 and the last VPN are mapped
    entries = [None] * 1024
    entries[0], entries[-1] = 5, 9
    linear = LinearPageTable(256, tuple(entries), 4)
    two = TwoLevelPageTable.from_linear(linear)
    assert linear.size_bytes == 4096
    assert two.size_bytes == 256 + 2 * 256  # directory of 16 entries fits one page, plus 2 pieces
    assert two.translate(1023 * 256 + 7).paddr == 9 * 256 + 7


def test_page_table_sizes_by_hand():
    assert linear_table_bytes(1 << 32, 4096, 4) == 4 << 20  # 32-bit space: 4 MiB per process
    # x86-64: 48-bit addresses, 4 KiB pages, 8-byte entries, 4 levels; one mapped page needs one
    # table page per level, while a linear table would need 2^36 entries of 8 bytes
    assert multilevel_table_bytes([0x12345], 48, 4096, 8, 4) == 4 * 4096
    assert multilevel_table_bytes([0x12345], 48, 4096, 8, 1) == 512 << 30
    # two pages far apart share only the top-level page
    assert multilevel_table_bytes([0, (1 << 36) - 1], 48, 4096, 8, 4) == 7 * 4096


def test_tlb_array_walk_hit_rate():
    # ten 4-byte ints from virtual address 100 with 16-byte pages (OSTEP ch. 19): bytes 96-111
    # are VPN 6 (a[0..2] at 100, 104, 108), 112-127 VPN 7 (a[3..6]), 128-143 VPN 8 (a[7..9])
    vpns = array_walk_vpns(100, 4, 10, 16)
    assert vpns == [6, 6, 6, 7, 7, 7, 7, 8, 8, 8]
    result = simulate_tlb(vpns, num_entries=4)
    assert (result.hits, result.misses) == (7, 3)
    assert result.hit_rate == pytest.approx(0.7)


def test_policies_on_textbook_trace():
    trace = [0, 1, 2, 0, 1, 3, 0, 3, 1, 2, 1]
    hits = {p: simulate_policy(trace, 3, p).num_hits for p in ("OPT", "LRU", "FIFO")}
    assert hits == {"OPT": 6, "LRU": 6, "FIFO": 4}
    opt = simulate_policy(trace, 3, "OPT")
    assert opt.evicted[5] == 2  # at the first access to 3, page 2 is the one used farthest ahead


def test_fifo_belady_anomaly():
    trace = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]
    assert simulate_policy(trace, 3, "FIFO").num_misses == 9
    assert simulate_policy(trace, 4, "FIFO").num_misses == 10  # more frames, more misses


def test_clock_gives_a_second_chance():
    # frames fill with 1,2,3 (all use bits set); 1 is re-used; 4 arrives: the hand clears 1,2,3
    # and comes back to 1, so CLOCK evicts 1 like FIFO would; then 2 and 3 have clear bits
    result = simulate_policy([1, 2, 3, 1, 4, 1, 5], 3, "CLOCK")
    assert result.evicted[4] == 1
    assert result.evicted[6] == 3  # 1 was re-used after 4 came in: 2 is gone, 3 has no use bit
    assert result.resident[-1] == (4, 1, 5)


@settings(max_examples=100, deadline=None)
@given(trace=st.lists(st.integers(0, 9), min_size=1, max_size=60), frames=st.integers(1, 6))
def test_opt_never_misses_more_than_other_policies(trace, frames):
    opt = simulate_policy(trace, frames, "OPT").num_misses
    for policy in ("LRU", "FIFO", "CLOCK"):
        assert opt <= simulate_policy(trace, frames, policy).num_misses


def test_same_seed_same_problem():
    a = random_linear_problem(7, "16k", "64k", "1k", 8, 50)
    b = random_linear_problem(7, "16k", "64k", "1k", 8, 50)
    assert a.table == b.table and a.addresses == b.addresses
    others = {random_linear_problem(s, "16k", "64k", "1k", 8, 50).table for s in range(5)}
    assert len(others) > 1


def test_too_little_physical_memory_is_a_clear_error():
    with pytest.raises(ValueError, match="physical"):
        random_linear_problem(0, "64k", "4k", "1k", 1, 100)


def test_cli_echoes_arguments_and_hides_answers_until_asked(capsys):
    main(["translate", "-s", "3", "-a", "32k", "-p", "128k", "-P", "2k", "-n", "4", "-u", "70"])
    hidden = capsys.readouterr().out
    for line in ("ARG seed 3", "ARG address space size 32k", "ARG phys mem size 128k",
                 "ARG page size 2k", "ARG num addresses 4", "ARG used percent 70"):
        assert line in hidden
    assert "PA or fault?" in hidden
    assert "PFN" not in hidden.split("Virtual address trace")[1]
    main(["translate", "-s", "3", "-a", "32k", "-p", "128k", "-P", "2k", "-n", "4", "-u", "70",
          "-c"])
    shown = capsys.readouterr().out
    problem = random_linear_problem(3, "32k", "128k", "2k", 4, 70)
    for t in problem.answers:
        assert (f"fault (VPN {t.vpn}" if t.fault else f"{t.paddr:#010x}") in shown
        assert not t.fault or t.fault_kind == "segfault"  # no -w: nothing is swapped out


def test_cli_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "simulators.paging", "policy", "-A", "1,2,3,4,1,2,5,1,2,3,4,5",
         "-C", "3", "-p", "FIFO", "-c"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "ARG policy FIFO" in out and "FINALSTATS hits 3 misses 9" in out
    multi = subprocess.run(
        [sys.executable, "-m", "simulators.paging", "multilevel", "-s", "1", "-c"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "ARG code pages 6" in multi and "PDBR:" in multi and "page 127:" in multi


def test_simulators_do_not_import_torch():
    code = ("import sys, simulators.paging, simulators.paging_problems, simulators.paging_exercises, "
            "simulators.paging_cli, "
            "simulators.kv_memory, simulators.kv_allocator, simulators.kv_exercises, "
            "simulators.block_exercises, simulators.paper, simulators.exercises; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exercise_checker_says_why():
    kinds = set()
    for seed in range(40):
        ex = make_exercise(seed)
        answer = ex.solution()
        assert ex.check(answer).correct
        kinds.add(answer if isinstance(answer, str) else "address")
        if isinstance(answer, str):
            assert not ex.check(0).correct
            other = "page fault" if answer == "segfault" else "segfault"
            assert not ex.check(other).correct
            assert "which fault" in ex.check("fault").why
        else:
            assert not ex.check("segfault").correct
            wrong_offset = ex.check(answer ^ 1)
            assert not wrong_offset.correct and "offset" in wrong_offset.why
            wrong_frame = ex.check(answer + 4096 * 20)
            assert not wrong_frame.correct and "frame" in wrong_frame.why
    assert kinds == {"address", "segfault", "page fault"}  # the seeds exercise every outcome


def test_swapped_page_is_a_page_fault_and_invalid_page_a_segfault():
    table = LinearPageTable(4096, (3, None, SWAPPED, 0))
    assert table.translate(0x0123).fault_kind is None and table.translate(0x0123).paddr == 0x3123
    seg, pf = table.translate(0x1000), table.translate(0x2000)
    assert (seg.valid, seg.present, seg.fault_kind) == (False, False, "segfault")
    assert (pf.valid, pf.present, pf.fault_kind) == (True, False, "page fault")
    two = TwoLevelPageTable.from_linear(LinearPageTable(64, (1, SWAPPED) + (None,) * 30, 4))
    assert two.translate(64 + 5).fault_kind == "page fault"
    assert two.translate(3 * 64).fault_kind == "segfault"


def test_swapped_percent_keeps_the_valid_pages():
    plain = random_linear_problem(5, "64k", "256k", "1k", 0, 60, 0)
    swapped = random_linear_problem(5, "64k", "256k", "1k", 0, 60, 50)
    assert [e is None for e in plain.table.entries] == [e is None for e in swapped.table.entries]
    assert SWAPPED in swapped.table.entries and SWAPPED not in plain.table.entries

"""Tests of simulators.paging_problems and the paging CLI: the memory-dump walk, the exercises,
and that each exercise's command prints the same problem and (with -c) the same answer."""

import random
import re

import pytest

from simulators.exercises import Exercise
from simulators.paging import simulate_policy
from simulators.paging_cli import build_parser, main
from simulators.paging_exercises import (
    make_belady_exercise,
    make_exercise,
    make_multilevel_exercise,
    make_policy_exercise,
    make_tlb_exercise,
)
from simulators.paging_problems import belady_trace, random_multilevel_problem

MAKERS = [make_exercise, make_multilevel_exercise, make_tlb_exercise, make_policy_exercise,
          make_belady_exercise]


def _cli(capsys, command: str) -> str:
    argv = command.split()[3:]  # drop "python -m simulators.paging"
    main(argv)
    return capsys.readouterr().out


def test_walk_through_the_dump_agrees_with_the_mapping_it_was_built_from():
    for seed in range(30):
        problem = random_multilevel_problem(seed, num_addresses=0)
        rng = random.Random(seed)
        for vpn in range(0, 1024, 7):
            vaddr = vpn * 32 + rng.randrange(32)
            w = problem.walk(vaddr)
            if vpn in problem.mapping:
                assert w.paddr == problem.mapping[vpn] * 32 + vaddr % 32
                assert w.value == problem.memory[problem.mapping[vpn]][vaddr % 32]
            else:
                assert w.fault


def test_clustered_defaults_make_the_two_level_table_smaller():
    for seed in range(50):
        p = random_multilevel_problem(seed)
        assert p.linear_table_bytes == 1024
        # directory + the code piece + at most 2 heap pieces (10 pages) + the stack piece
        assert 3 * 32 <= p.two_level_bytes <= 5 * 32 < p.linear_table_bytes


def test_a_hand_worked_walk():
    p = random_multilevel_problem(0, num_addresses=0)
    vaddr = 0x7FEA  # the top of the stack: directory index 31, table index 31, offset 10
    pde = p.memory[p.pdbr][31]
    assert pde & 0x80
    pte = p.memory[pde & 0x7F][31]
    assert pte & 0x80
    assert p.walk(vaddr).paddr == (pte & 0x7F) * 32 + 10


def test_multilevel_rejects_impossible_sizes():
    with pytest.raises(ValueError, match="physical pages"):
        random_multilevel_problem(0, phys_pages=10)
    with pytest.raises(ValueError, match="7-bit"):
        random_multilevel_problem(0, phys_pages=256)


@pytest.mark.parametrize("maker", MAKERS, ids=lambda m: m.__name__)
def test_every_exercise_is_seeded_checks_itself_and_does_not_call_an_unanswered_one_wrong(maker):
    for seed in range(12):
        a, b = maker(seed), maker(seed)
        assert isinstance(a, Exercise) and a.question == b.question and a.solution() == b.solution()
        assert a.check(a.solution()).correct
        unanswered = a.check(None)
        assert not unanswered.answered and str(unanswered).startswith("not answered yet")
        assert not str(unanswered).startswith("wrong")
    assert len({maker(s).question for s in range(12)}) > 6


def test_exercise_commands_print_the_same_answer_with_c(capsys):
    for seed in range(25):
        ex = make_exercise(seed)
        out = _cli(capsys, ex.command + " -c")
        line = out.split("Virtual address trace")[1].strip().splitlines()[0]
        sol = ex.solution()
        if sol == "segfault":
            assert "--> segfault" in line
        elif sol == "page fault":
            assert "--> page fault" in line
        else:
            assert f"--> {sol:#010x}" in line
        assert f"VA {int(ex.question.split('virtual address ')[1].split()[0], 16):#010x}" in line

        ml = make_multilevel_exercise(seed)
        out = _cli(capsys, ml.command + " -c")
        line = out.split("Virtual address trace")[1].strip().splitlines()[0]
        assert ("--> fault" in line) if ml.solution() == "fault" else (f"PA {ml.solution():#06x}" in line)
        pdbr = re.search(r"PDBR .*?: (\d+)", ml.question).group(1)
        assert f"PDBR: {pdbr}" in out

        pol = make_policy_exercise(seed)
        out = _cli(capsys, pol.command + " -c")
        marks = "".join("h" if " Hit " in ln else "m" for ln in out.splitlines() if "Access:" in ln)
        assert marks == pol.solution()


def test_wrong_answers_get_specific_hints():
    tlb = make_tlb_exercise(1)
    assert "misses" in tlb.check(_misses(tlb)).why
    pol = make_policy_exercise(2)
    flipped = "".join("m" if c == "h" else "h" for c in pol.solution()[:1]) + pol.solution()[1:]
    assert "access 1" in pol.check(flipped).why
    assert "exactly" in pol.check("hm").why
    bel = make_belady_exercise(0)
    m3, m4 = bel.solution()
    assert "3-frame count is right" in bel.check((m3, m4 + 1)).why
    ml = make_multilevel_exercise(4)
    if ml.solution() != "fault":
        assert "offset" in ml.check(ml.solution() ^ 1).why


def _misses(ex: Exercise) -> int:
    return int(re.search(r"of the (\d+) accesses", ex.question).group(1)) - ex.solution()


def test_belady_traces_really_are_anomalous():
    for seed in range(5):
        trace = belady_trace(seed)
        assert simulate_policy(trace, 4, "FIFO").num_misses > simulate_policy(trace, 3, "FIFO").num_misses
        # LRU is a stack algorithm: never more misses with more frames
        assert simulate_policy(trace, 4, "LRU").num_misses <= simulate_policy(trace, 3, "LRU").num_misses


def test_help_speaks_to_students_and_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "Practice problems on paging" in top and "-c" in top and "Examples" in top
    subparsers = next(a for a in build_parser()._actions if a.choices)
    assert set(subparsers.choices) == {"translate", "multilevel", "policy", "tlb"}
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help and len(action.help) > 10, (name, action.dest)
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "(default:" in capsys.readouterr().out  # defaults are shown

"""`python -m simulators.paging translate` speaks OSTEP: the chapter-18 homework commands run unchanged
and print the page table and translations that OSTEP's own paging-linear-translate.py prints for the
same seed (recorded in tests/data/ostep_paging_linear.json by scripts/ostep_paging_fixture.py, from
OSTEP's script itself), and bad flags get an error that names the flag, quickly."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simulators.paging import PRESENT_BIT, VALID_BIT, decode_pte, encode_pte
from simulators.paging_cli import main
from simulators.paging_problems import random_linear_problem

ROOT = Path(__file__).resolve().parent.parent
RECORDS = json.loads((ROOT / "tests" / "data" / "ostep_paging_linear.json").read_text())["records"]


def _ours(capsys, command: str) -> dict:
    """Run our translate with OSTEP's flags plus -c; the entries and translations it printed."""
    assert main(["translate", *command.split(), "-c"]) == 0
    out = capsys.readouterr().out
    table, trace = out.split("Page table (from entry 0 down to the max size)")[1].split(
        "Virtual address trace")
    ptes = [int(h, 16) for h in re.findall(r"0x([0-9a-f]{8})", table)]
    translations = []
    for line in trace.splitlines():
        m = re.match(r"\s+VA 0x([0-9a-f]+) .*--> (?:0x([0-9a-f]{8})|segfault)", line)
        if m:
            translations.append([int(m.group(1), 16), None if m.group(2) is None else int(m.group(2), 16)])
    return {"ptes": ptes, "trace": translations, "text": out}


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["command"] or "defaults")
def test_same_page_table_and_translations_as_ostep(capsys, record):
    ours = _ours(capsys, record["command"])
    ptes = ours["ptes"]
    assert len(ptes) == record["num_entries"]
    assert ptes[: len(record["ptes_head"])] == record["ptes_head"]
    assert sum(p != 0 for p in ptes) == record["num_valid"]
    digest = hashlib.sha256("\n".join(f"{p:#010x}" for p in ptes).encode()).hexdigest()
    assert digest == record["ptes_sha256"]
    assert ours["trace"] == record["trace"]
    assert all(p == 0 or (p & VALID_BIT and not p & PRESENT_BIT) for p in ptes)  # no present bit


def test_the_homework_commands_run_unchanged_from_a_shell():
    # question 3's "quite crazy" sizes, verbatim, as a student types them
    out = subprocess.run([sys.executable, "-m", "simulators.paging", "translate", "-P", "1m", "-a",
                          "256m", "-p", "512m", "-v", "-s", "3"],
                         capture_output=True, text=True, timeout=60, check=True, cwd=ROOT).stdout
    assert "ARG verbose True" in out and "[     255]  0x" in out
    assert "PA or fault?" in out and "segfault (VPN" not in out  # no answers without -c


def test_verbose_adds_the_vpn_and_nothing_else(capsys):
    main(["translate", "-P", "1k", "-a", "16k", "-p", "32k", "-u", "50"])
    plain = capsys.readouterr().out
    main(["translate", "-P", "1k", "-a", "16k", "-p", "32k", "-u", "50", "-v"])
    verbose = capsys.readouterr().out
    assert re.findall(r"^  0x[0-9a-f]{8}$", plain, re.M) == [
        "  " + h for h in re.findall(r"^  \[ +\d+\]  (0x[0-9a-f]{8})$", verbose, re.M)]
    assert len(re.findall(r"^  \[ +\d+\]", verbose, re.M)) == 16 and "[" not in plain.split("Page table")[1]


def test_swapped_pages_add_the_present_bit_and_keep_frames_and_addresses(capsys):
    base = random_linear_problem(3, "32k", "64k", "1k", 10, 70)
    swapped = random_linear_problem(3, "32k", "64k", "1k", 10, 70, swapped_percent=40)
    assert base.addresses == swapped.addresses
    for plain, entry in zip(base.table.entries, swapped.table.entries, strict=True):
        assert entry == plain or (plain is not None and entry == -1)
    main(["translate", "-s", "3", "-a", "32k", "-p", "64k", "-P", "1k", "-n", "10", "-u", "70",
          "-w", "40", "-v", "-c"])
    out = capsys.readouterr().out
    printed = [int(h, 16) for h in re.findall(r"\]  0x([0-9a-f]{8})", out)]
    assert printed == [encode_pte(e, present_bit=True) for e in swapped.table.entries]
    assert any(p == 0x80000000 for p in printed) and any(p & 0xC0000000 == 0xC0000000 for p in printed)
    assert "PRESENT bit" in out and "page fault" in out


def test_pte_encoding_round_trips():
    for present_bit in (False, True):
        for entry in (None, 0, 5, (1 << 30) - 1) + ((-1,) if present_bit else ()):
            assert decode_pte(encode_pte(entry, present_bit), present_bit) == entry
    assert encode_pte(6) == 0x80000006 and encode_pte(6, present_bit=True) == 0xC0000006
    with pytest.raises(ValueError, match="present bit"):
        encode_pte(-1)


def test_own_addresses_with_A_decimal_or_hex(capsys):
    main(["translate", "-A", "0x3229,4969", "-c"])  # OSTEP's first address, in hex and decimal
    out = capsys.readouterr().out
    assert "ARG addresses 0x3229,4969" in out
    assert "VA 0x00003229 (decimal:    12841) --> 0x00006229" in out  # OSTEP README: 0x3229 -> 0x6229
    assert "VA 0x00001369 (decimal:     4969) --> segfault (VPN 1" in out


def test_physical_memory_need_not_be_a_power_of_two():
    problem = random_linear_problem(0, "16k", "48k", "4k", 50, 100)  # 12 frames
    frames = [e for e in problem.table.entries if e is not None]
    assert len(frames) == len(set(frames)) == 4 and max(frames) < 12


@pytest.mark.parametrize("argv, flag", [
    (["-a", "64g", "-P", "1"], "-a"),      # used to hang and eat memory: OSTEP refuses >= 1 GB
    (["-p", "1g"], "-p"),
    (["-a", "512m", "-P", "1", "-p", "768m"], "-P"),   # 2^29 lines to print
    (["-a", "16x"], "-a"),                  # used to show int()'s raw message
    (["-P", "4kb"], "-P"),
    (["-p", "0"], "-p"),
    (["-a", "24k", "-p", "64k"], "-a"),     # not a power of two
    (["-P", "3k"], "-P"),
    (["-p", "50000"], "-p"),                # not a multiple of the page size
    (["-a", "64k", "-p", "32k"], "-p"),     # OSTEP: physical memory must be larger
    (["-a", "64k", "-p", "64k"], "-p"),
    (["-A", "1,2,x"], "-A"),
    (["-A", "16384"], "-A"),                # outside the 16k space
    (["-n", "-1"], "-n"),
    (["-n", "10000000"], "-n"),
    (["-u", "101"], "-u"),
    (["-w", "-5"], "-w"),
    (["-s", "one"], "-s"),
])
def test_bad_flags_fail_fast_with_an_error_that_names_the_flag(capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err, err
    assert "invalid literal" not in err and "Traceback" not in err


def test_acceptance_does_not_depend_on_the_seed():
    # -p not larger than -a is refused for every seed; larger is accepted for every seed, at any -u
    for seed in range(40):
        with pytest.raises(ValueError, match="-p"):
            random_linear_problem(seed, "64k", "32k", "4k", 1, 100)
        problem = random_linear_problem(seed, "64k", "68k", "4k", 1, 100)
        assert all(e is not None for e in problem.table.entries)  # -u 100: every page valid


def test_the_largest_table_allowed_still_gets_distinct_frames():
    # 65536 pages, one spare frame, every page valid: the slowest case the limits allow
    problem = random_linear_problem(0, 1 << 16, (1 << 16) + 1, 1, 0, 100)
    frames = problem.table.entries
    assert len(frames) == 1 << 16 and None not in frames and len(set(frames)) == 1 << 16
    with pytest.raises(ValueError, match="-P"):
        random_linear_problem(0, 1 << 17, 1 << 18, 1, 0, 100)


def test_every_chapter_18_homework_command_is_compared():
    homework = ["-P 1k -a 1m -p 512m -v -n 0", "-P 1k -a 2m -p 512m -v -n 0",
                "-P 1k -a 4m -p 512m -v -n 0", "-P 2k -a 1m -p 512m -v -n 0",
                "-P 4k -a 1m -p 512m -v -n 0"]
    homework += [f"-P 1k -a 16k -p 32k -v -u {u}" for u in (0, 25, 50, 75, 100)]
    homework += ["-P 8 -a 32 -p 1024 -v -s 1", "-P 8k -a 32k -p 1m -v -s 2",
                 "-P 1m -a 256m -p 512m -v -s 3"]
    assert set(homework) <= {r["command"] for r in RECORDS}

"""Record what OSTEP's own ``paging-linear-translate.py`` prints, for tests/test_paging_ostep.py.

Runs OSTEP's script (not part of this repository: pass the path of your copy, from the repository
remzi-arpacidusseau/ostep-homework, folder vm-paging) with ``-c`` on each command of
``OSTEP_COMMANDS`` and writes, per command, the page table and the translations it printed:

    python scripts/ostep_paging_fixture.py PATH/TO/paging-linear-translate.py \\
        --commit COMMIT --out tests/data/ostep_paging_linear.json

The tests then run ``python -m simulators.paging translate`` with the same flags and compare.
Large tables are stored as a sha256 of their printed entries plus the first entries, to keep the
file small.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

# OSTEP chapter 18 ("Paging: Introduction") homework questions 1-3, then the README's first run,
# then flags beyond the homework: -A, a physical memory that is not a power of two, other seeds.
OSTEP_COMMANDS = [
    "-P 1k -a 1m -p 512m -v -n 0",
    "-P 1k -a 2m -p 512m -v -n 0",
    "-P 1k -a 4m -p 512m -v -n 0",
    "-P 2k -a 1m -p 512m -v -n 0",
    "-P 4k -a 1m -p 512m -v -n 0",
    "-P 1k -a 16k -p 32k -v -u 0",
    "-P 1k -a 16k -p 32k -v -u 25",
    "-P 1k -a 16k -p 32k -v -u 50",
    "-P 1k -a 16k -p 32k -v -u 75",
    "-P 1k -a 16k -p 32k -v -u 100",
    "-P 8 -a 32 -p 1024 -v -s 1",
    "-P 8k -a 32k -p 1m -v -s 2",
    "-P 1m -a 256m -p 512m -v -s 3",
    "",
    "-p 48k -A 1,5000,16383",
    "-s 7 -a 64k -p 96k -P 1k -n 12 -u 80",
    "-s 11 -a 32 -p 40 -P 4 -v -n 8",
]
HEAD = 16  # entries stored verbatim


def ptes_digest(ptes: list[int]) -> str:
    """sha256 of the entries as 0x%08x lines: the same text for both simulators."""
    return hashlib.sha256("\n".join(f"{p:#010x}" for p in ptes).encode()).hexdigest()


def parse_ostep(text: str) -> dict:
    """Page-table entries and translations (physical address, or None when invalid) from OSTEP's output."""
    table = text.split("Page Table (from entry 0 down to the max size)")[1].split("Virtual Address Trace")[0]
    ptes = [int(m, 16) for m in re.findall(r"0x([0-9a-f]{8})", table)]
    trace = []
    for line in text.split("Virtual Address Trace")[1].splitlines():
        m = re.match(r"\s+VA 0x([0-9a-f]+) .*--> +(?:([0-9a-f]{8}) |Invalid)", line)
        if m:
            trace.append([int(m.group(1), 16), None if m.group(2) is None else int(m.group(2), 16)])
    return {"num_entries": len(ptes), "num_valid": sum(p != 0 for p in ptes),
            "ptes_sha256": ptes_digest(ptes), "ptes_head": ptes[:HEAD], "trace": trace}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ostep_script", type=Path, help="path to OSTEP's paging-linear-translate.py")
    parser.add_argument("--commit", default="",
                        help="the ostep-homework commit the script comes from, recorded in the JSON")
    parser.add_argument("--out", type=Path, default=Path("tests/data/ostep_paging_linear.json"),
                        help="where to write the JSON")
    args = parser.parse_args(argv)
    if not args.ostep_script.is_file():
        parser.error(f"ostep_script: no file at {args.ostep_script}")
    records = []
    for command in OSTEP_COMMANDS:
        out = subprocess.run([sys.executable, str(args.ostep_script), *command.split(), "-c"],
                             capture_output=True, text=True, check=True).stdout
        records.append({"command": command, **parse_ostep(out)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    source = "remzi-arpacidusseau/ostep-homework vm-paging/paging-linear-translate.py"
    if args.commit:
        source += f" at commit {args.commit}"
    args.out.write_text(json.dumps({"source": source + ", run with -c",
                                    "records": records}, indent=1) + "\n")
    print(f"wrote {len(records)} commands to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

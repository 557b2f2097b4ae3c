"""Wrong and valid answers to notebook 01's graded cells, as cell sources a student could submit.

Each entry replaces the cell tagged ``course:answer:<name>`` or ``course:implement:<name>:...`` in the
student release. Every source in MUTANTS must lose that question's points; every source in ALTERNATIVES
must earn them all. Answers read the student's own problem (``ex1.question`` and friends), as a student
does; a few use the course's simulators, as a student may.
"""

_PARSE_EX1 = '''import re
q = ex1.question
size = int(re.search(r"\\((\\d+) bytes\\)", q).group(1))
vaddr = int(re.search(r"virtual address (0x[0-9a-f]+)", q).group(1), 16)
entries = {int(v): rest for v, rest in re.findall(r"VPN +(\\d+): (.*)", q)}
vpn, offset = vaddr // size, vaddr % size
entry = entries[vpn]
pfn = int(entry.rsplit("PFN", 1)[1]) if "PFN" in entry else None
'''

_PARSE_EX2 = '''import re
q = ex2.question
pdbr = int(re.search(r"PDBR[^:]*: (\\d+)", q).group(1))
memory = {int(n): [int(b, 16) for b in row.split()] for n, row in re.findall(r"page +(\\d+): ([0-9a-f ]+)", q)}
vaddr = int(re.search(r"virtual address (0x[0-9a-f]+)", q).group(1), 16)
pd, pt, off = vaddr >> 10, (vaddr >> 5) & 31, vaddr & 31
pde = memory[pdbr][pd]
pte = memory[pde & 0x7F][pt] if pde & 0x80 else None
'''

_PARSE_EX3 = '''import re
q = ex3.question
count, size, base, passes = (int(x) for x in re.search(
    r"reads (\\d+) (\\d+)-byte integers starting at virtual address (\\d+), (\\d+) time", q).groups())
page, entries = (int(x) for x in re.search(r"Pages are (\\d+) bytes; the TLB has (\\d+) entries", q).groups())
vpns = [(base + i * size) // page for i in range(count)] * passes
'''

_PARSE_EX4 = '''import re
q = ex4.question
trace = [int(x) for x in re.search(r"Trace ([\\d ]+),", q).group(1).split()]
frames = int(re.search(r"(\\d+) frames", q).group(1))
policy = re.search(r"policy (\\w+)", q).group(1)
'''

_PARSE_EX5 = '''import re
trace = [int(x) for x in re.search(r"Trace ([\\d ]+),", ex5.question).group(1).split()]

def fifo_misses(trace, frames):
    memory, misses = [], 0
    for page in trace:
        if page not in memory:
            misses += 1
            memory.append(page)
            if len(memory) > frames:
                memory.pop(0)
    return misses
'''

_PARSE_EX6 = '''import re
options = dict(re.findall(r"\\(([a-d])\\) (.*)", ex6.question))
def letter(words):
    return next(k for k, text in options.items() if words in text)
'''

MUTANTS = {
    "ex1": [
        # forgets the offset; says "fault" without saying which one
        _PARSE_EX1 + 'my_answer = "fault" if pfn is None else pfn * size',
        # uses the VPN as the frame, and ignores the valid and present bits
        _PARSE_EX1 + "my_answer = vpn * size + offset",
        # swaps the two faults; one frame too far
        _PARSE_EX1 + ('my_answer = ("page fault" if entry.startswith("invalid") else "segfault")'
                      ' if pfn is None else (pfn + 1) * size + offset'),
    ],
    "ex2": [
        # stops at the page table: the frame of the table page, not of the data
        _PARSE_EX2 + "my_answer = (pde & 0x7F) * 32 + off",
        # keeps the valid bit in the frame number, and walks on through invalid entries
        _PARSE_EX2 + "my_answer = memory.get(pde & 0x7F, [0] * 32)[pt] * 32 + off",
        # answers the frame number, not the address, and walks on through invalid entries
        _PARSE_EX2 + "my_answer = memory.get(pde & 0x7F, [0] * 32)[pt] & 0x7F",
    ],
    "ex3": [
        # counts misses, not hits
        _PARSE_EX3 + ("from simulators.paging import simulate_tlb\n"
                      "my_answer = simulate_tlb(vpns, entries).misses"),
        # counts the first touch of each page as a hit too
        _PARSE_EX3 + ("from simulators.paging import simulate_tlb\n"
                      "my_answer = simulate_tlb(vpns, entries).hits + len(set(vpns))"),
        # forgets that the array starts at base (as if at address 0), and ignores the TLB's size
        _PARSE_EX3 + ("vpns0 = [(i * size) // page for i in range(count)] * passes\n"
                      "my_answer = len(vpns0) - len(set(vpns0)) + 1"),
    ],
    "ex4": [
        # hits and misses the other way round
        _PARSE_EX4 + ("from simulators.paging import simulate_policy\n"
                      'my_answer = "".join("m" if h else "h" for h in simulate_policy(trace, frames, policy).hits)'),
        # infinite memory: a page hits whenever it was seen before
        _PARSE_EX4 + 'my_answer = "".join("h" if p in trace[:i] else "m" for i, p in enumerate(trace))',
        # one frame fewer than the question says
        _PARSE_EX4 + ("from simulators.paging import simulate_policy\n"
                      'my_answer = "".join("h" if h else "m" for h in simulate_policy(trace, frames - 1, policy).hits)'),
    ],
    "ex5": [
        _PARSE_EX5 + "my_answer = (fifo_misses(trace, 4), fifo_misses(trace, 3))",  # the pair swapped
        # LRU instead of FIFO (a hit refreshes the page)
        _PARSE_EX5 + ("from simulators.paging import simulate_policy\n"
                      'my_answer = tuple(simulate_policy(trace, f, "LRU").num_misses for f in (3, 4))'),
        _PARSE_EX5 + "my_answer = (len(trace) - fifo_misses(trace, 3), len(trace) - fifo_misses(trace, 4))",  # hits
    ],
    "ex6": [
        _PARSE_EX6 + 'my_answer = letter("each entry smaller")',
        _PARSE_EX6 + 'my_answer = letter("only the valid pages")',
        _PARSE_EX6 + 'my_answer = letter("fewer physical frames")',
    ],
    "task": [
        '''def translate(vaddr, page_table, page_size):  # forgets the offset
    pte = page_table[vaddr // page_size]
    return (pte & 0x7FFFFFFF) * page_size if pte & 0x80000000 else None''',
        '''def translate(vaddr, page_table, page_size):  # ignores the valid bit
    vpn, offset = divmod(vaddr, page_size)
    return (page_table[vpn] & 0x7FFFFFFF) * page_size + offset''',
        '''def translate(vaddr, page_table, page_size):  # assumes 4 KiB pages
    pte = page_table[(vaddr >> 12) % len(page_table)]
    return ((pte & 0x7FFFFFFF) << 12 | vaddr & 0xFFF) if pte & 0x80000000 else None''',
    ],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + ('my_answer = ("SEGFAULT" if entry.startswith("invalid") else "Page Fault") '
                      'if pfn is None else f"{pfn * size + offset:#x}"'),
        _PARSE_EX1 + ('bits = size.bit_length() - 1\n'
                      'my_answer = (" segfault " if "not valid" in entry or entry.startswith("invalid") '
                      'else "page fault") if pfn is None else (pfn << bits) | (vaddr & (size - 1))'),
    ],
    "ex2": [
        _PARSE_EX2 + 'my_answer = "fault" if pte is None or not pte & 0x80 else (pte & 0x7F) * 32 + off',
        _PARSE_EX2 + ('ok = pde >> 7 and pte is not None and pte >> 7\n'
                      'my_answer = hex(((pte & 0x7F) << 5) | off) if ok else "segfault"'),
    ],
    "ex3": [
        _PARSE_EX3 + ('from collections import OrderedDict\ntlb, hits = OrderedDict(), 0\n'
                      'for v in vpns:\n    if v in tlb:\n        hits += 1\n        tlb.move_to_end(v)\n'
                      '    else:\n        tlb[v] = None\n        if len(tlb) > entries:\n            tlb.popitem(last=False)\n'
                      'my_answer = hits'),
        _PARSE_EX3 + ("from simulators.paging import simulate_tlb\n"
                      "my_answer = str(simulate_tlb(vpns, entries).hits)"),
    ],
    "ex4": [
        _PARSE_EX4 + ("from simulators.paging import simulate_policy\n"
                      'my_answer = "".join("h" if h else "m" for h in simulate_policy(trace, frames, policy).hits)'),
        _PARSE_EX4 + ("from simulators.paging import simulate_policy\n"
                      'my_answer = " ".join("H" if h else "M" for h in simulate_policy(trace, frames, policy).hits)'),
    ],
    "ex5": [
        _PARSE_EX5 + "my_answer = (fifo_misses(trace, 3), fifo_misses(trace, 4))",
        _PARSE_EX5 + ("from simulators.paging import simulate_policy\n"
                      'my_answer = [simulate_policy(trace, f, "FIFO").num_misses for f in (3, 4)]'),
    ],
    "ex6": [
        _PARSE_EX6 + 'my_answer = letter("each entry maps a bigger page")',
        _PARSE_EX6 + 'my_answer = "(" + letter("fewer entries cover the space").upper() + ")"',
    ],
    "task": [
        '''def translate(vaddr, page_table, page_size):
    bits = page_size.bit_length() - 1
    pte = page_table[vaddr >> bits]
    if pte >> 31 == 0:
        return None
    return ((pte & ~(1 << 31)) << bits) | (vaddr & (page_size - 1))''',
        '''def translate(vaddr, page_table, page_size):
    vpn, offset = divmod(vaddr, page_size)
    valid, pfn = divmod(page_table[vpn], 0x80000000)
    return pfn * page_size + offset if valid else None''',
    ],
}

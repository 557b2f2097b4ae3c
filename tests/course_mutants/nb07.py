"""Wrong and valid answers to notebook 07's graded cells, as cell sources a student could submit.

As in nb01.py: each entry replaces the cell tagged ``course:answer:<name>`` or
``course:implement:<name>:...`` of the student release. The staged-rows alternatives use three free-list
orders (FIFO, stack, lowest first): the checker grades properties, so all earn full marks; its mutants
leak rows, hand out a live row, move rows, or send too much or too little. The launch alternatives are a
fresh pinned block per copy and a ring of three pinned buffers; its mutants race, wait or copy from
pageable memory.
"""

# what never appears in 07's student release: the runner's rows behind the task's interface, the printed
# source of the runner's race fix, and the fix itself
REFERENCES = ("RunnerRows", "getsource", "buffers.pinned", "pin_memory(host)", "RequestStateRows(capacity")

_PARSE_EX1 = '''import ast
import re
q = ex1.question
first = ast.literal_eval(re.search(r"Step 1 runs (\\[.*?\\])", q).group(1))
before = ast.literal_eval(re.search(r"with idx_mapping (\\[.*?\\])", q).group(1))
gone, new = re.search(r"Then (\\w+) finishes and (\\w+) is admitted", q).groups()
batch = ast.literal_eval(re.search(r"Step 2's batch, in order, is (\\[.*?\\])", q).group(1))
row = dict(zip(first, before))
'''

_PARSE_EX2 = '''import re
host, device = (int(x) for x in re.search(r"spends (\\d+) µs of host work.*?then (\\d+) µs on the device",
                                          ex2.question).groups())
'''

_PARSE_EX3 = '''import re
text = re.search(r'this sentence: "(.*)"\\. Which', ex3.question).group(1)
meaning = ("kernel" if "CUDA" in text else "memory model" if "pool" in text or "row per request" in text
           else "abstraction")
'''

_ROWS_HEAD = '''from collections import deque
import heapq


class MyRows:
    def __init__(self, capacity, width):
        self.width, self.capacity = width, capacity
        self.free = deque(range(capacity))
        self.stack = list(range(capacity - 1, -1, -1))
        self.heap = list(range(capacity))
        self.row_of, self.held, self.pending, self.next_row = {}, {}, [], 0
'''

_ROWS_TAIL = '''
    def pack(self):
        cells, ids = [c for c, _ in self.pending], [b for _, b in self.pending]
        self.pending = []
        return np.array(cells + ids, dtype=np.int64)

    def apply(self, mirror, packed):
        m = len(packed) // 2
        mirror[packed[:m]] = packed[m:]
'''


def _rows(take: str, give: str, write: str = "", pack: str = "") -> str:
    """A MyRows whose new row is ``take``, whose release gives the row back with ``give`` (``row`` is the
    freed row), whose sync writes per ``write`` (default: only what changed) and whose pack is ``pack``."""
    write = write or '''        start = len(held) if list(blocks[:len(held)]) == held else 0
'''
    src = _ROWS_HEAD + f'''
    def sync(self, request_id, blocks):
        if request_id not in self.row_of:
            self.row_of[request_id], self.held[request_id] = {take}, []
        row, held = self.row_of[request_id], self.held[request_id]
{write}        self.pending += [(row * self.width + c, blocks[c]) for c in range(start, len(blocks))]
        self.held[request_id] = list(blocks)
        return row

    def release(self, request_id):
        row = self.row_of.pop(request_id)
        del self.held[request_id]
        {give}
''' + _ROWS_TAIL
    if pack:
        src = src.replace('''        self.pending = []
        return np.array''', pack + '''
        return np.array''')
    return src


_FIFO = _rows("self.free.popleft()", "self.free.append(row)")
_STACK = _rows("self.stack.pop()", "self.stack.append(row)")
_LOWEST = _rows("heapq.heappop(self.heap)", "heapq.heappush(self.heap, row)")

MUTANTS = {
    "ex1": [
        _PARSE_EX1 + "my_answer = list(range(len(batch)))",  # rows follow batch order (V1's thinking)
        # the new request takes a fresh row after the used ones, not the freed one
        _PARSE_EX1 + "row[new] = len(first)\nmy_answer = [row[r] for r in batch]",
        # the right rows, listed in row order instead of batch order
        _PARSE_EX1 + "row[new] = row[gone]\nmy_answer = sorted(row[r] for r in batch)",
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = host / (host + device)",  # the host's share of the step
        _PARSE_EX2 + "my_answer = (host + device) / device",  # the speed-up factor, not the fraction
        _PARSE_EX2 + "my_answer = device / (host + device)",  # what is left of the old step
    ],
    "ex3": [
        # each meaning confused with the next
        _PARSE_EX3 + ('my_answer = {"kernel": "abstraction", "abstraction": "memory model", '
                      '"memory model": "kernel"}[meaning]'),
        _PARSE_EX3 + ('my_answer = {"kernel": "memory model", "abstraction": "kernel", '
                      '"memory model": "abstraction"}[meaning]'),
        _PARSE_EX3 + 'my_answer = "deleted" if meaning == "kernel" else "kept"',  # answers the other question
    ],
    "rows_task": [
        _rows("self.next_row", "pass").replace("self.row_of[request_id], self.held[request_id] = self.next_row, []",
                                               "self.row_of[request_id], self.held[request_id] = self.next_row, []\n"
                                               "            self.next_row += 1"),  # never reuses a row
        _rows("len(self.row_of)", "pass"),  # the number of rows in use: a live row once a lower one left
        _rows("self.free.popleft()", "self.free.append(row)",
              write="        start = 0\n"),  # resends every table whole each step
        _rows("self.stack.pop()", "self.stack.append(row)",
              write="        start = len(held)\n"),  # a re-allocated table is not written again
        _rows("self.free.popleft()", "self.free.append(row)",
              pack="        pass  # forgets to clear: sends old cells again"),
    ],
    "launch_task": [
        '''def my_launch(host, stream, pool, state):  # one pinned buffer reused: the race
    buf = state.setdefault("buf", pool.empty(len(host)))
    buf[:] = host
    stream.copy_async(buf)''',
        '''def my_launch(host, stream, pool, state):  # V1's barrier: right values, but the host waits
    buf = state.setdefault("buf", pool.empty(len(host)))
    stream.synchronize()
    buf[:] = host
    stream.copy_async(buf)''',
        '''def my_launch(host, stream, pool, state):  # a copy from pageable memory cannot run ahead
    stream.copy_async(host.copy())''',
        '''def my_launch(host, stream, pool, state):  # a ring too shallow for a device two steps behind
    bufs = state.setdefault("bufs", [pool.empty(len(host)) for _ in range(2)])
    state["i"] = state.get("i", -1) + 1
    bufs[state["i"] % 2][:] = host
    stream.copy_async(bufs[state["i"] % 2])''',
    ],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + "row[new] = row[gone]\nmy_answer = [row[r] for r in batch]",
        # a free list as the question states it: the freed row is the next handed out
        _PARSE_EX1 + ("import numpy as np\nfree = [r for r in range(6) if r not in before] + [row.pop(gone)]\n"
                      "row[new] = free.pop()\nmy_answer = tuple(np.array([row[r] for r in batch]))"),
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = host / device",
        _PARSE_EX2 + 'my_answer = f"{((host + device) / device - 1) * 100:.2f}%"',
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = meaning",
        '''import re
text = re.search(r'this sentence: "(.*)"\\. Which', ex3.question).group(1)
if ".cu" in text or "file" in text:
    my_answer = "Kernel"
elif "fixed-size" in text or "grown" in text:
    my_answer = " memory model "
else:
    my_answer = "ABSTRACTION"''',
    ],
    "rows_task": [_FIFO, _STACK, _LOWEST],
    "launch_task": [
        '''def my_launch(host, stream, pool, state):  # a fresh pinned block per copy
    stream.copy_async(pool.pin_memory(host))''',
        '''def my_launch(host, stream, pool, state):  # a ring of three pinned buffers (UvaBufferPool)
    bufs = state.setdefault("bufs", [pool.empty(len(host)) for _ in range(3)])
    state["i"] = state.get("i", -1) + 1
    buf = bufs[state["i"] % 3]
    buf[:] = host
    stream.copy_async(buf)''',
    ],
}

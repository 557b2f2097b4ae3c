"""Wrong and valid answers to notebook 05's graded cells, as cell sources a student could submit.

As in nb01.py: each entry replaces the cell tagged ``course:answer:<name>`` or
``course:implement:<name>:...`` of the student release. Every source in MUTANTS must lose that
question's points; every source in ALTERNATIVES must earn them all. The capture-and-replay
implement-it forbids ``StepBuffers`` (the runner's writes, its reference): one mutant uses it.
"""

_PARSE_EX1 = '''import re
ladder = [int(x) for x in re.search(r"Captured sizes \\[([\\d, ]+)\\]", ex1.question).group(1).split(",")]
batch = int(re.search(r"batch of (\\d+) sequences", ex1.question).group(1))
'''

_PARSE_EX2 = '''import re
blocks = int(re.search(r"has (\\d+) blocks", ex2.question).group(1))
rows = {c: dict(slot=int(s), seq_len=int(n), table=[int(b) for b in t.split(",")], token=int(tok))
        for c, s, n, t, tok in re.findall(
            r"\\(([a-d])\\) slot (-?\\d+), seq_len (\\d+), block-table row \\[([\\d, ]+)\\], token id (-?\\d+)",
            ex2.question)}
# the rows that break a rule the mutants below forget (a mutant falls back to one of them)
unsafe = [c for c, r in sorted(rows.items()) if r["slot"] >= 0 or r["seq_len"] or r["token"] < 0
          or max(r["table"]) >= blocks]
'''

_PARSE_EX3 = '''import re
q = ex3.question
shares = {int(b): float(p) / 100 for b, p in re.findall(r"(\\d+) \\((\\d+)%\\)", q)}
ladders = {c: [int(x) for x in v.split(",")] for c, v in re.findall(r"\\(([a-c])\\) \\[([\\d, ]+)\\]", q)}


def waste(ladder):
    return sum(p * (min(r for r in ladder if r >= b) - b) for b, p in shares.items())
'''

_PARSE_EX4 = '''import re
lines = dict(re.findall(r"\\(([a-h])\\) (.*)", ex4.question))
breaks = ("int(", ".any()", "max_blocks_now", "print(")
right = "".join(c for c, line in sorted(lines.items()) if any(b in line for b in breaks))
'''

# a replay_step with knobs, each a known mistake when set (the notebook's solution with defaults);
# tests/test_graph_replay_exercise.py runs the same source
REPLAY_SOURCE = '''def _replay(graphs, buffers, ids, positions, tables, block_size, pad_slot=-1, pad=True, in_place=True,
            seq_offset=1, full_width=True, bucket_rule=None):
    import numpy as np
    sizes = sorted(graphs)
    n = len(ids)
    bucket = bucket_rule(n, sizes) if bucket_rule else next(b for b in sizes if b >= n)
    rows = {"input_ids": [0] * bucket, "positions": [0] * bucket, "slot_mapping": [pad_slot] * bucket,
            "seq_lens": [0] * bucket}
    table_rows = np.zeros((bucket, buffers["block_tables"].shape[1]), np.int32)
    for r in range(n):
        pos, table = positions[r], tables[r]
        rows["input_ids"][r], rows["positions"][r] = ids[r], pos
        rows["slot_mapping"][r] = table[pos // block_size] * block_size + pos % block_size
        rows["seq_lens"][r] = pos + seq_offset
        table_rows[r, :len(table)] = table
    end = bucket if pad else n
    for name, values in rows.items():
        if in_place:
            buffers[name][:end] = values[:end]
        else:
            buffers[name] = np.array(values)
    if full_width:
        buffers["block_tables"][:end] = table_rows[:end]
    else:
        for r in range(n):
            buffers["block_tables"][r, :len(tables[r])] = tables[r]
    return graphs[bucket].replay()[:n]


'''

MUTANTS = {
    "ex1": [
        # the right bucket, padding rows off by one (the last real row counted as padding)
        _PARSE_EX1 + "b = next(r for r in ladder if r >= batch)\nmy_answer = (b, b - batch + 1)",
        # the right bucket, but its size as the padding
        _PARSE_EX1 + "b = next(r for r in ladder if r >= batch)\nmy_answer = (b, b)",
        # always the largest graph
        _PARSE_EX1 + "my_answer = (ladder[-1], ladder[-1] - batch)",
    ],
    "ex2": [
        # it writes nowhere and attends to nothing: the ids it holds were not checked
        _PARSE_EX2 + ("my_answer = next(c for c, r in sorted(rows.items()) if r['slot'] == -1 and r['seq_len'] == 0"
                      " and (max(r['table']) >= blocks or r['token'] < 0))"),
        # it attends to nothing: the slot it writes was not checked
        _PARSE_EX2 + ("my_answer = next((c for c, r in sorted(rows.items()) if r['slot'] >= 0 and r['seq_len'] == 0),"
                      " unsafe[0])"),
        # the row the previous step left (real-looking values)
        _PARSE_EX2 + "my_answer = next((c for c, r in sorted(rows.items()) if r['seq_len'] > 0), unsafe[-1])",
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = max(ladders, key=lambda c: waste(ladders[c]))",  # the most waste
        # more rungs, less waste: the ladder with the most captured sizes
        _PARSE_EX3 + "my_answer = max(sorted(ladders), key=lambda c: len(ladders[c]))",
        _PARSE_EX3 + "my_answer = sorted(ladders, key=lambda c: waste(ladders[c]))[1]",  # the runner-up
    ],
    "ex4": [
        _PARSE_EX4 + 'my_answer = "".join(sorted(lines))',  # every line
        _PARSE_EX4 + ('allocs = "".join(c for c, line in lines.items() if "empty_like" in line or "=" in line)\n'
                      'my_answer = "".join(sorted(set(right) | set(allocs)))'),  # every assignment too
        _PARSE_EX4 + 'my_answer = "".join(sorted(set(lines) - set(right)))',  # the complement
    ],
    "task": [
        REPLAY_SOURCE + "def replay_step(graphs, buffers, ids, positions, tables, block_size):  # stale padding rows\n"
                  "    return _replay(graphs, buffers, ids, positions, tables, block_size, pad=False)",
        REPLAY_SOURCE + "def replay_step(graphs, buffers, ids, positions, tables, block_size):  # pads with slot 0\n"
                  "    return _replay(graphs, buffers, ids, positions, tables, block_size, pad_slot=0)",
        REPLAY_SOURCE + "def replay_step(graphs, buffers, ids, positions, tables, block_size):  # new arrays\n"
                  "    return _replay(graphs, buffers, ids, positions, tables, block_size, in_place=False)",
        REPLAY_SOURCE + "def replay_step(graphs, buffers, ids, positions, tables, block_size):  # seq_len = position\n"
                  "    return _replay(graphs, buffers, ids, positions, tables, block_size, seq_offset=0)",
        REPLAY_SOURCE + "def replay_step(graphs, buffers, ids, positions, tables, block_size):  # always the largest\n"
                  "    return _replay(graphs, buffers, ids, positions, tables, block_size,\n"
                         "                   bucket_rule=lambda n, sizes: sizes[-1])",
        # right, but has the runner's own StepBuffers write the rows: the reference, forbidden
        '''import numpy as np
import torch

from minirunner.worker.buffers import StepBuffers


def replay_step(graphs, buffers, ids, positions, tables, block_size):
    n, width = len(ids), buffers["block_tables"].shape[1]
    bucket = next(b for b in sorted(graphs) if b >= n)
    sb = StepBuffers(torch.device("cpu"), bucket, bucket, width, block_size)
    t = np.zeros((n, width), np.int32)
    for r, row in enumerate(tables):
        t[r, :len(row)] = row
    sb.put_graph_rows(t, None, bucket)
    sb.write_uniform(bucket, n, torch.tensor(ids).view(n, 1), torch.tensor(positions).view(n, 1))
    for name in buffers:
        buffers[name][:bucket] = getattr(sb, name)[:bucket].numpy()
    return graphs[bucket].replay()[:n]''',
    ],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + "import bisect\nb = ladder[bisect.bisect_left(ladder, batch)]\nmy_answer = (b, b - batch)",
        _PARSE_EX1 + "b = min(r for r in ladder if r >= batch)\nmy_answer = [str(b), str(b - batch)]",
    ],
    "ex2": [
        _PARSE_EX2 + ("my_answer = next(c for c, r in sorted(rows.items()) if r['slot'] == -1 and r['seq_len'] == 0"
                      " and max(r['table']) < blocks and r['token'] >= 0)"),
        _PARSE_EX2 + ("safe = [c for c, r in rows.items() if r['slot'] < 0 and not r['seq_len']"
                      " and all(0 <= b < blocks for b in r['table']) and r['token'] >= 0]\n"
                      "my_answer = safe[0].upper() + ') writes nowhere, reads nothing, valid ids'"),
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = min(ladders, key=lambda c: waste(ladders[c]))",
        _PARSE_EX3 + ("from simulators.graph_exercises import expected_padding_rows\n"
                      "my_answer = min(ladders, key=lambda c: expected_padding_rows(shares, ladders[c]))"),
    ],
    "ex4": [
        _PARSE_EX4 + "my_answer = right",
        _PARSE_EX4 + "my_answer = list(right.upper())",
    ],
    "task": [
        REPLAY_SOURCE + "def replay_step(graphs, buffers, ids, positions, tables, block_size):\n"
                  "    return _replay(graphs, buffers, ids, positions, tables, block_size)",
        # vectorised with numpy, rows written in one assignment per buffer
        '''import bisect

import numpy as np


def replay_step(graphs, buffers, ids, positions, tables, block_size):
    sizes = sorted(graphs)
    n = len(ids)
    bucket = sizes[bisect.bisect_left(sizes, n)]
    pos = np.asarray(positions, dtype=np.int64)
    table = np.zeros((bucket, buffers["block_tables"].shape[1]), dtype=buffers["block_tables"].dtype)
    for r, t in enumerate(tables):
        table[r, :len(t)] = t
    slots = np.full(bucket, -1, dtype=np.int64)
    slots[:n] = table[np.arange(n), pos // block_size] * block_size + pos % block_size
    buffers["input_ids"][:bucket] = np.pad(np.asarray(ids), (0, bucket - n))
    buffers["positions"][:bucket] = np.pad(pos, (0, bucket - n))
    buffers["slot_mapping"][:bucket] = slots
    buffers["seq_lens"][:bucket] = np.pad(pos + 1, (0, bucket - n))
    buffers["block_tables"][:bucket] = table
    return graphs[bucket].replay()[:n].tolist()''',
    ],
}

"""Wrong and valid answers to notebook 03's graded cells, as cell sources a student could submit.

As in nb01.py: each entry replaces the cell tagged ``course:answer:<name>`` or
``course:implement:<name>:...`` of the student release. The valid answers include runs of the real
runner (``run_problem`` and ``make_llm``, defined in the notebook), an independent way to the answer.
"""

_PARSE_EX1 = '''import re
bs = int(re.search(r"block_size = (\\d+)", ex1.question).group(1))
table = [int(b) for b in re.search(r"block_table = \\[([\\d, ]+)\\]", ex1.question).group(1).split(",")]
pos = int(re.search(r"token position (\\d+)", ex1.question).group(1))
'''

_PARSE_EX2 = '''import re
rid, k = (int(x) for x in re.search(r"request (\\d+)'s block table during step (\\d+)", ex2.question).groups())
problem = block_exercises.block_table_problem(ex2.seed)
twin = block_exercises.simulate_block_tables(**problem)
'''

_PARSE_EX3 = '''problem = block_exercises.preemption_problem(ex3.seed)
twin = block_exercises.simulate_block_tables(**problem)
first = next(s for s in twin if s.preempted)
'''

_PARSE_EX4 = '''import re
bs = int(re.search(r"block size (\\d+)", ex4.question).group(1))
n2, shared = (int(x) for x in re.search(r"has (\\d+) tokens, of which the first (\\d+)", ex4.question).groups())
'''

MUTANTS = {
    "ex1": [
        _PARSE_EX1 + "my_answer = table[pos // bs]",  # the physical block's id, not the slot
        _PARSE_EX1 + "my_answer = table[pos // bs] * bs",  # forgets the offset in the block
        _PARSE_EX1 + "my_answer = pos",  # the logical position, not mapped through the table
        _PARSE_EX1 + "my_answer = table[pos // bs - 1] * bs + pos % bs",  # logical blocks counted from 1
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = [b + 1 for b in twin[k].block_tables[rid]]",  # block ids counted from 1
        _PARSE_EX2 + "my_answer = twin[k].block_tables[rid][:-1] or [-1]",  # the new token not counted
        _PARSE_EX2 + "my_answer = twin[0].block_tables[rid] + [max(twin[0].block_tables[rid]) + 1] * (k + 1)",
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = (first.preempted[0], first.step + 1)",  # one step late
        _PARSE_EX3 + "my_answer = (first.scheduled[0], first.step)",  # the oldest request, not the newest
        _PARSE_EX3 + "my_answer = (first.preempted[0], first.step - 1)",  # one step early
    ],
    "ex4": [
        _PARSE_EX4 + "my_answer = shared",  # a partly filled block counted as cached
        _PARSE_EX4 + "my_answer = -(-shared // bs) * bs",  # rounds up to whole blocks
        _PARSE_EX4 + "my_answer = bs * min(shared // bs, (n2 - 1) // bs) + 1",  # the last prompt token too
    ],
    "task": [
        '''def slot_mapping(block_table, block_size, start, end):  # forgets the offset
    return [block_table[p // block_size] * block_size for p in range(start, end)]''',
        '''def slot_mapping(block_table, block_size, start, end):  # stops one position early
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end - 1)]''',
        '''def slot_mapping(block_table, block_size, start, end):  # ignores the table: contiguous KV
    return list(range(start, end))''',
    ],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + "block, offset = divmod(pos, bs)\nmy_answer = str(table[block] * bs + offset)",
        _PARSE_EX1 + "import numpy as np\nmy_answer = np.int64(np.asarray(table)[pos // bs] * bs + pos % bs)",
    ],
    "ex2": [
        # the real runner on the same scenario
        _PARSE_EX2 + "trace, ids = run_problem(problem)\nmy_answer = trace[k]['block_tables'][ids[rid]]",
        _PARSE_EX2 + "import numpy as np\nmy_answer = tuple(np.array(twin[k].block_tables[rid]))",
    ],
    "ex3": [
        _PARSE_EX3 + ("trace, ids = run_problem(problem)\nstep = next(s for s in trace if s['preempted_ids'])\n"
                      "my_answer = (ids.index(step['preempted_ids'][0]), step['step'])"),
        _PARSE_EX3 + "my_answer = [first.preempted[0], first.step]",
    ],
    "ex4": [
        _PARSE_EX4 + ("p4 = block_exercises.cached_tokens_problem(ex4.seed)\n"
                      "run = make_llm(block_size=bs, num_kv_blocks=64, enable_prefix_caching=True)\n"
                      "run.generate([p4['first']], greedy(2), use_tqdm=False)\n"
                      "out = run.generate([p4['second']], greedy(2), use_tqdm=False)[0]\n"
                      "my_answer = out.metrics.num_cached_prompt_tokens"),
        _PARSE_EX4 + "my_answer = bs * min(shared // bs, (n2 - 1) // bs)",
    ],
    "task": [
        '''def slot_mapping(block_table, block_size, start, end):
    slots = []
    for pos in range(start, end):
        block, offset = divmod(pos, block_size)
        slots.append(block_table[block] * block_size + offset)
    return slots''',
        '''def slot_mapping(block_table, block_size, start, end):
    pos = torch.arange(start, end)
    return torch.tensor(block_table)[pos // block_size] * block_size + pos % block_size''',
    ],
}

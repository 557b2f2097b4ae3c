"""Wrong and valid answers to notebook 02's graded cells, as cell sources a student could submit.

As in nb01.py: each entry replaces the cell tagged ``course:answer:<name>`` or
``course:implement:<name>:...`` of the student release. Every source in MUTANTS must lose that
question's points; every source in ALTERNATIVES must earn them all. Answers read the student's own
problem (``ex1.question``...); a few use the course's simulators, as a student may.
"""

_PARSE_CONFIG = '''import re
cfg = dict(re.findall(r"(\\w+)=(\\w+)", {ex}.question))
layers, heads, kv_heads, head_dim = (int(cfg[k]) for k in ("num_hidden_layers", "num_attention_heads",
                                                           "num_key_value_heads", "head_dim"))
nbytes = {{"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}}[cfg["torch_dtype"]]
'''
_PARSE_EX1 = _PARSE_CONFIG.format(ex="ex1")
_PARSE_EX2 = _PARSE_CONFIG.format(ex="ex2")

_PARSE_EX3 = '''import re
q = ex3.question
gib = int(re.search(r"has (\\d+) GiB", q).group(1))
per_token = int(re.search(r"with ([\\d,]+) bytes", q).group(1).replace(",", ""))
max_len = int(re.search(r"max_model_len = (\\d+)", q).group(1))
'''

MUTANTS = {
    "ex1": [
        _PARSE_EX1 + "my_answer = layers * kv_heads * head_dim * nbytes",  # K only: the factor 2 missing
        _PARSE_EX1 + "my_answer = 2 * layers * heads * head_dim * nbytes",  # query heads, not KV heads
        _PARSE_EX1 + "my_answer = 2 * kv_heads * head_dim * nbytes",  # one layer: the layers forgotten
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = 2 * layers * kv_heads * head_dim * 2",  # the bf16 answer: FP8 ignored
        _PARSE_EX2 + "my_answer = layers * kv_heads * head_dim",  # FP8, but K only
        _PARSE_EX2 + "my_answer = 2 * layers * heads * head_dim",  # FP8, but query heads
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = -(-(gib * 2**30 // per_token) // max_len)",  # rounds up
        _PARSE_EX3 + "my_answer = gib * 10**9 // per_token // max_len",  # GB, not GiB
        _PARSE_EX3 + "my_answer = gib * 2**30 // per_token",  # token slots, not requests
    ],
    "task": [
        '''def blocks_needed(num_tokens, block_size):  # floor division: the last partial block lost
    return num_tokens // block_size''',
        '''def blocks_needed(num_tokens, block_size):  # always one block more than a full one needs
    return num_tokens // block_size + 1''',
        '''def blocks_needed(num_tokens, block_size):  # at least one block, even for no tokens
    return max(1, -(-num_tokens // block_size))''',
    ],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + "my_answer = str(2 * layers * kv_heads * head_dim * nbytes)",
        _PARSE_EX1 + ("from simulators.kv_memory import kv_bytes_per_token\n"
                      "my_answer = kv_bytes_per_token({'num_hidden_layers': layers, 'num_attention_heads': heads,"
                      " 'num_key_value_heads': kv_heads, 'head_dim': head_dim, 'hidden_size': heads * head_dim,"
                      " 'torch_dtype': cfg['torch_dtype']})"),
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = 2 * layers * kv_heads * head_dim",  # one byte per element
        _PARSE_EX2 + "import numpy as np\nmy_answer = np.int64(np.prod([2, layers, kv_heads, head_dim, nbytes]))",
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = (gib << 30) // (per_token * max_len)",
        _PARSE_EX3 + "import math\nmy_answer = math.floor(gib * 2**30 / per_token / max_len)",
    ],
    "task": [
        '''def blocks_needed(num_tokens, block_size):
    return -(-num_tokens // block_size)''',
        '''def blocks_needed(num_tokens, block_size):
    import math
    return math.ceil(num_tokens / block_size)''',
    ],
}

"""Wrong and valid answers to notebook 06's graded cells, as cell sources a student could submit.

As in nb01.py: each entry replaces the cell tagged ``course:answer:<name>`` or
``course:implement:<name>:...`` of the student release. Implement-its receive their arrays as lists
(practice data and the grader alike), so every source converts what it needs.
"""

# never in 06's student release: the reference rule, the wrappers of the runner's twin and its noise,
# the runner's dynamic-k rule and the builders that need them
REFERENCES = ("rejection_sample_chain", "twin_chain", "runner_noise", "runner_choose_k", "AcceptanceDrivenK",
              "rejection_task(", "dynamic_k_task(")

_PQ = '''import re
def _dist(pattern, text):
    return {k: float(v) for k, v in re.findall(r"(\\w): ([\\d.]+)", re.search(pattern, text).group(1))}
'''

_PARSE_EX1 = _PQ + '''p = _dist(r"Target p = \\{(.*?)\\}", ex1.question)
q = _dist(r"Draft +q = \\{(.*?)\\}", ex1.question)
'''

_PARSE_EX2 = _PQ + '''p = _dist(r"Target p = \\{(.*?)\\}", ex2.question)
q = _dist(r"Draft +q = \\{(.*?)\\}", ex2.question)
n, y = re.search(r"About how many of the (\\d+) emitted tokens are (\\w)\\?", ex2.question).groups()
n = int(n)
'''

_PARSE_EX3 = '''import re
options = dict(re.findall(r"\\(([a-c])\\) (.*)", ex3.question))
def letter(words):
    return next(k for k, text in options.items() if words in text)
regime = ("overhead" if "CPU" in ex3.question else "compute" if "256 requests" in ex3.question else "memory")
'''



def _sampler(accept="p[j, x] >= u[j] * q[j, x]", residual="np.maximum(p[j] - q[j], 0)",
             bonus="out + [int(np.argmax(np.log(p[-1]) + g[-1]))]", stop="return out") -> str:
    """A rejection sampler with one part swapped: the accept test, the residual drawn from after a
    rejection, what is returned when every draft passes, and what follows a rejection."""
    return f'''def my_rejection_sampler(p, q, draft, u, g, seed=None, position=None):
    p, q, g = np.asarray(p, float), np.asarray(q, float), np.asarray(g, float)
    out = []
    for j, x in enumerate(int(t) for t in draft):
        if {accept}:
            out.append(x)
            continue
        with np.errstate(divide="ignore"):
            out.append(int(np.argmax(np.log({residual}) + g[j])))
        {stop or "pass"}
    return {bonus}'''

_CHOOSE_HEAD = '''def my_choose_k(history, plain_s, call, k_max, warmup_steps, probe_every):
    if len(history) < warmup_steps:
        return k_max
    accepted = sum(s["accepted"] for s in history)
    tested = sum(s["accepted"] + (s["accepted"] < s["k"]) for s in history)
    drafted = sum(s["k"] for s in history)
    alpha = accepted / tested
    c = sum(s["propose_s"] for s in history) / drafted / plain_s
    v = sum(s["verify_s"] for s in history) / len(history) / plain_s
'''

_CHOOSE_TAIL = '''    def factor(k):
        return 1.0 if k == 0 else (1 - alpha ** (k + 1)) / (1 - alpha) / (k * c + v)
    scores = [factor(k) for k in range(k_max + 1)]
    k = scores.index(max(scores))
    return 1 if k == 0 and call % probe_every == 0 else k
'''

MUTANTS = {
    "ex1": [
        _PARSE_EX1 + "my_answer = sum(p[t] * q[t] for t in p)",  # two independent draws agree
        _PARSE_EX1 + "my_answer = 1 - sum(abs(p[t] - q[t]) for t in p)",  # the total variation without its 1/2
        _PARSE_EX1 + "my_answer = sum(min(1, p[t] / q[t]) for t in p) / len(p)",  # not weighted by q
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = round(n * q[y])",  # how often the draft proposes it
        _PARSE_EX2 + "my_answer = round(n * min(p[y], q[y]))",  # accepted drafts only
        _PARSE_EX2 + "my_answer = round(n * (p[y] + q[y]) / 2)",  # a mixture of the two
    ],
    "ex3": [
        # launches, capacity, KV: the first misconception of each regime
        _PARSE_EX3 + ('my_answer = letter({"memory": "kernel launches", "compute": "memory capacity", '
                      '"overhead": "KV reads"}[regime])'),
        _PARSE_EX3 + ('my_answer = letter({"memory": "the draft\'s work", "compute": "the sampler", '
                      '"overhead": "weight reads: the draft"}[regime])'),
        # the right option's neighbour (the letters read one off)
        _PARSE_EX3 + ('right = letter({"memory": "all 140 GB", "compute": "1280 tokens per weight read", '
                      '"overhead": "one layer still dispatches"}[regime])\n'
                      'my_answer = "abc"[("abc".index(right) + 1) % 3]'),
    ],
    "task": [
        _sampler(accept="q[j, x] >= u[j] * p[j, x]"),  # the accept test upside down: u < q/p
        _sampler(residual="p[j]"),  # after a rejection, draws from p instead of max(0, p - q)
        _sampler(bonus="out"),  # forgets the bonus token when every draft passes
        _sampler(stop=""),  # does not stop at the first rejection
    ],
    "k_task": [
        _CHOOSE_HEAD + "    alpha = accepted / drafted  # acceptance over proposed, not tested, drafts\n" + _CHOOSE_TAIL,
        _CHOOSE_HEAD + "    c = c * drafted / len(history)  # cost per step, not per draft token\n" + _CHOOSE_TAIL,
        _CHOOSE_HEAD + "    v = 1.0  # a verify pass taken to cost one plain step\n" + _CHOOSE_TAIL,
        _CHOOSE_HEAD + _CHOOSE_TAIL.replace("    return 1 if k == 0 and call % probe_every == 0 else k",
                                            "    return k  # never probes: a 0 freezes the estimates"),
    ],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + "my_answer = sum(min(p[t], q[t]) for t in p)",
        _PARSE_EX1 + 'my_answer = f"{1 - sum(abs(p[t] - q[t]) for t in p) / 2:.3f}"',
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = round(n * p[y])",
        # accepted drafts plus the rejections' share of the residual, computed out
        _PARSE_EX2 + ('alpha = sum(min(p[t], q[t]) for t in p)\nres = {t: max(0.0, p[t] - q[t]) for t in p}\n'
                      'my_answer = n * (min(p[y], q[y]) + (1 - alpha) * res[y] / sum(res.values()))'),
    ],
    "ex3": [
        _PARSE_EX3 + ('my_answer = letter({"memory": "all 140 GB", "compute": "1280 tokens per weight read", '
                      '"overhead": "one layer still dispatches"}[regime])'),
        _PARSE_EX3 + ('my_answer = letter({"memory": "reuse every byte", "compute": "past the ridge", '
                      '"overhead": "embedding, norms"}[regime]).upper() + ") because of the regime"'),
    ],
    "task": [
        _sampler(accept="u[j] < p[j, x] / q[j, x]"),  # the ratio form of the test
        # torch, with the residual normalised first (a constant shift of its log: the same argmax)
        '''def my_rejection_sampler(p, q, draft, u, g, seed=None, position=None):
    p, q, g = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64), torch.tensor(g, dtype=torch.float64)
    for j, x in enumerate(draft):
        if float(u[j]) * q[j, x] > p[j, x]:
            r = (p[j] - q[j]).clamp(min=0)
            return [int(t) for t in draft[:j]] + [int(torch.argmax(torch.log(r / r.sum()) + g[j]))]
    return [int(t) for t in draft] + [int(torch.argmax(torch.log(p[-1]) + g[-1]))]''',
    ],
    "k_task": [
        _CHOOSE_HEAD + _CHOOSE_TAIL,
        # c as the mean of per-step ratios, and a loop that keeps the first best k
        '''def my_choose_k(history, plain_s, call, k_max, warmup_steps, probe_every):
    if len(history) < warmup_steps:
        return k_max
    tested = sum(min(s["accepted"] + 1, s["k"]) for s in history)
    alpha = sum(s["accepted"] for s in history) / tested
    c = sum(s["propose_s"] for s in history) / sum(s["k"] for s in history) / plain_s
    v = sum(s["verify_s"] / plain_s for s in history) / len(history)
    best, best_factor = 0, 1.0
    for k in range(1, k_max + 1):
        e = sum(alpha ** i for i in range(k + 1))
        if e / (k * c + v) > best_factor:
            best, best_factor = k, e / (k * c + v)
    if best == 0 and call % probe_every == 0:
        return 1
    return best''',
    ],
}

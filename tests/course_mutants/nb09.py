"""Wrong and valid answers to notebook 09's graded cells, as cell sources a student could submit.

As in nb01.py: each entry replaces the cell tagged ``course:answer:<name>`` or
``course:implement:<name>:...`` of the student release. The goodput sources are the instructor's
committed solutions (``simulators.serving_instructor``: each known-wrong one a real mistake, two valid
ones written another way), renamed to the notebook's ``my_goodput``.
"""

import inspect

from simulators import serving_instructor as si

# never in 09's student release: the reference goodput and the grader's task built on it
REFERENCES = ("reference_goodput", "goodput_grading_task", "serving_instructor")

_HELPERS = inspect.getsource(si._tpot) + "\n\n" + inspect.getsource(si._ok) + "\n\n"


def _goodput(f) -> str:
    return _HELPERS + inspect.getsource(f).replace(f"def {f.__name__}(", "def my_goodput(")


_STEP = '''import re
alpha, beta, gamma = (float(x) * 1e-3 for x in re.search(
    r"alpha = ([\\d.]+) ms per step, beta = ([\\d.]+) ms per decoding request, gamma = ([\\d.]+) ms per prefill",
    {q}.question).groups())
'''

_PARSE_EX1 = _STEP.format(q="ex1") + '''p, o = (int(x) for x in re.search(r"has a (\\d+)-token prompt and generates (\\d+) tokens", ex1.question).groups())
s = int(re.search(r"max_num_seqs = (\\d+) requests", ex1.question).group(1))
'''

_PARSE_EX2 = '''import re
options = dict(re.findall(r"\\(([a-d])\\) (.*)", ex2.question))
def letter(words):
    return next(k for k, text in options.items() if text.startswith(words))
'''

_PARSE_EX3 = _STEP.format(q="ex3") + '''d, prompt = (int(x) for x in re.search(r"(\\d+) requests are decoding when a (\\d+)-token prompt", ex3.question).groups())
budget = int(re.search(r"max_num_batched_tokens = (\\d+)", ex3.question).group(1))
'''

MUTANTS = {
    "ex1": [
        _PARSE_EX1 + "my_answer = s / (o * alpha + (o - 1) * beta * s)",  # leaves out the prefill
        _PARSE_EX1 + "my_answer = 1 / (o * alpha + (o - 1) * beta * s + gamma * s * p)",  # one seat's rate
        _PARSE_EX1 + "my_answer = o * s / (o * alpha + (o - 1) * beta * s + gamma * s * p)",  # tokens per second
    ],
    "ex2": [
        _PARSE_EX2 + 'my_answer = letter("p50 ITL grows")',
        _PARSE_EX2 + 'my_answer = letter("both grow")',
        _PARSE_EX2 + 'my_answer = letter("neither changes")',
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = (alpha + beta * d + gamma * prompt) * 1e3",  # the whole prompt in one step
        _PARSE_EX3 + "my_answer = (alpha + beta * d + gamma * min(prompt, budget)) * 1e3",  # decodes not counted
        _PARSE_EX3 + "my_answer = (alpha + beta * d) * 1e3",  # a plain decode step: the chunk forgotten
    ],
    "goodput": [_goodput(f) for f in (si.ttft_only, si.tpot_with_ttft, si.longest_request_as_duration,
                                      si.strict_bounds, si.fraction_not_rate, si.one_token_fails)],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + "my_answer = s / (o * alpha + (o - 1) * beta * s + gamma * s * p)",
        _PARSE_EX1 + ("from simulators.serving_model import StepTime, capacity\n"
                      "my_answer = f'{capacity(StepTime(alpha, beta, gamma), p, o, s):.3f}'"),
    ],
    "ex2": [
        _PARSE_EX2 + 'my_answer = letter("p50 TTFT grows")',
        _PARSE_EX2 + 'my_answer = letter("p50 TTFT grows").upper() + ") the queue grows before the first token"',
    ],
    "ex3": [
        _PARSE_EX3 + "my_answer = (alpha + beta * d + gamma * min(prompt, budget - d)) * 1e3",
        _PARSE_EX3 + ("from simulators.serving_model import StepTime\n"
                      "chunk = budget - d if prompt > budget - d else prompt\n"
                      "my_answer = str(round(StepTime(alpha, beta, gamma)(d, chunk) * 1000, 4))"),
    ],
    "goodput": [_goodput(si.with_numpy), _goodput(si.by_exclusion)],
}

"""Wrong and valid answers to notebook 04's graded cells, as cell sources a student could submit.

As in nb01.py: each entry replaces the cell tagged ``course:answer:<name>`` or
``course:implement:<name>:...`` of the student release. Every source in MUTANTS must lose that
question's points; every source in ALTERNATIVES must earn them all. Answers read the student's own
problem (``ex1.question``...); a few use the course's simulators, as a student may. The eager-step
implement-it forbids ``simulate`` (its reference), so one mutant calls it and must get no points.
"""

_PARSE_STEP = '''import re
q = {ex}.question
kernels = [float(x) for x in re.search(r"\\[([\\d., ]+)\\]", q).group(1).split(",")]
launch = float((re.search(r"launch costs the host ([\\d.]+) µs", q)
               or re.search(r"([\\d.]+) µs per launch", q)).group(1))
other = float(re.search(r"([\\d.]+) µs (?:preparing inputs|of other host work)", q).group(1))


def eager(kernels, launch, other):
    host = end = other
    for k in kernels:
        host += launch
        end = max(host, end) + k
    return end
'''
_PARSE_EX1 = _PARSE_STEP.format(ex="ex1")
_PARSE_EX2 = _PARSE_STEP.format(ex="ex2")
_PARSE_EX3 = _PARSE_STEP.format(ex="ex3").replace(
    'q = ex3.question', 'import simulators.launch_problems as lp\n'
    'q = lp.make_step_exercise(int(re.search(r"make_step_exercise\\((\\d+)\\)", ex3.question).group(1))).question')

_PARSE_EX4 = '''import re
q = ex4.question
params = float(re.search(r"A ([\\d.]+)B-parameter", q).group(1)) * 1e9
layers, kv_heads = (int(x) for x in re.search(r"\\((\\d+) layers, (\\d+) KV heads", q).groups())
batch, context = (int(x) for x in re.search(r"batch of (\\d+) sequences of (\\d+) tokens", q).groups())
bandwidth = float(re.search(r"\\(([\\d.]+) TB/s", q).group(1)) * 1e12
kv = 2 * layers * kv_heads * 128 * 2
'''

_PARSE_EX5 = '''import re
q = ex5.question
params = float(re.search(r"A ([\\d.]+)B-parameter", q).group(1)) * 1e9
layers, heads, kv_heads = (int(x) for x in re.search(
    r"\\((\\d+) layers, (\\d+) query heads and (\\d+) KV heads", q).groups())
context = int(re.search(r"sequences of (\\d+) tokens", q).group(1))
options = {c: (float("inf") if v == "never" else float(v.split()[-1]))
           for c, v in re.findall(r"\\(([a-d])\\) (about \\d+|never)", q)}


def nearest(b):  # the option closest to b ("never" for an infinite b)
    return min(options, key=lambda c: 0.0 if options[c] == b else abs(options[c] - b))
'''

MUTANTS = {
    "ex1": [
        _PARSE_EX1 + "my_answer = other + sum(launch + k for k in kernels)",  # host waits for each kernel
        _PARSE_EX1 + "my_answer = other + len(kernels) * launch",  # the host's time only
        _PARSE_EX1 + "my_answer = eager(kernels, launch, other) - launch",  # the first launch is free
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = (len(kernels) - 1) * launch",  # the host time saved, not the step's
        _PARSE_EX2 + "my_answer = eager(kernels, launch, other)",  # the eager step, not the saving
        _PARSE_EX2 + "my_answer = eager(kernels, launch, other) - sum(kernels)",  # graph: no launch, no other
    ],
    "ex3": [
        # the option that leaves the longest step
        _PARSE_EX3 + ('opts = {"a": eager(kernels, launch / 2, other), "b": eager([k / 2 for k in kernels], launch, other),'
                      ' "c": other + launch + sum(kernels)}\nmy_answer = max(opts, key=opts.get)'),
        # the bound read backwards: a host-bound step "needs a faster device"
        _PARSE_EX3 + ('host_bound = other + len(kernels) * launch > sum(kernels)\n'
                      'opts = {"a": eager(kernels, launch / 2, other), "b": eager([k / 2 for k in kernels], launch, other)}\n'
                      'my_answer = "b" if opts["a"] < opts["b"] else "a"'),
        # the middle option
        _PARSE_EX3 + ('opts = {"a": eager(kernels, launch / 2, other), "b": eager([k / 2 for k in kernels], launch, other),'
                      ' "c": other + launch + sum(kernels)}\nmy_answer = sorted(opts, key=opts.get)[1]'),
    ],
    "ex4": [
        _PARSE_EX4 + "my_answer = params * 2 / bandwidth * 1e6",  # the weights alone
        _PARSE_EX4 + "my_answer = (params * 2 + batch * context * kv / 2) / bandwidth * 1e6",  # K or V once
        _PARSE_EX4 + "my_answer = (params * 2 + context * kv) / bandwidth * 1e6",  # one sequence's KV
    ],
    "ex5": [
        _PARSE_EX5 + "my_answer = nearest(989e12 / 4.8e12)",  # the ridge with the weights alone
        _PARSE_EX5 + "my_answer = nearest(1)",  # from batch 1
        # K or V counted once
        _PARSE_EX5 + ("from simulators.roofline import DecodeModel, saturation_batch\n"
                      "m = DecodeModel('x', params, 2, layers, heads, 128, 2 * layers * kv_heads * 128)\n"
                      "my_answer = nearest(saturation_batch(m, context, 4.8e12, 989e12))"),
    ],
    "task": [
        '''def eager_step_us(kernel_us, launch_us, host_other_us):  # the host waits for every kernel
    return host_other_us + sum(launch_us + k for k in kernel_us)''',
        '''def eager_step_us(kernel_us, launch_us, host_other_us):  # operator i issued at i launches
    end = 0.0
    for i, k in enumerate(kernel_us):
        end = max(host_other_us + i * launch_us, end) + k
    return end''',
        '''def eager_step_us(kernel_us, launch_us, host_other_us):  # the host work before the step forgotten
    end = 0.0
    for i, k in enumerate(kernel_us):
        end = max((i + 1) * launch_us, end) + k
    return end''',
        '''def eager_step_us(kernel_us, launch_us, host_other_us):  # right, but calls the reference
    return simulate(kernel_us, launch_us, host_other_us=host_other_us).step_us''',
    ],
    "floor_task": [
        '''def decode_floor(params, bytes_per_param, kv_bytes_per_token, batch, context, bandwidth, peak,
                 flops_per_token):  # the weights alone
    mem = params * bytes_per_param / bandwidth * 1e6
    comp = flops_per_token * batch / peak * 1e6
    return max(mem, comp), "bandwidth" if mem >= comp else "compute"''',
        '''def decode_floor(params, bytes_per_param, kv_bytes_per_token, batch, context, bandwidth, peak,
                 flops_per_token):  # the ceiling named backwards
    mem = (params * bytes_per_param + batch * context * kv_bytes_per_token) / bandwidth * 1e6
    comp = flops_per_token * batch / peak * 1e6
    return max(mem, comp), "compute" if mem >= comp else "bandwidth"''',
        '''def decode_floor(params, bytes_per_param, kv_bytes_per_token, batch, context, bandwidth, peak,
                 flops_per_token):  # the sum of the two floors, as if they did not overlap
    mem = (params * bytes_per_param + batch * context * kv_bytes_per_token) / bandwidth * 1e6
    comp = flops_per_token * batch / peak * 1e6
    return mem + comp, "bandwidth" if mem >= comp else "compute"''',
    ],
}

ALTERNATIVES = {
    "ex1": [
        _PARSE_EX1 + "my_answer = eager(kernels, launch, other)",
        # the closed form: the last kernel ends after the latest (issue time + the kernels from there on)
        _PARSE_EX1 + ("my_answer = str(max(other + (i + 1) * launch + sum(kernels[i:])"
                      " for i in range(len(kernels))))"),
    ],
    "ex2": [
        _PARSE_EX2 + "my_answer = eager(kernels, launch, other) - (other + launch + sum(kernels))",
        _PARSE_EX2 + ("from simulators.launch import simulate\n"
                      "my_answer = simulate(kernels, launch, host_other_us=other).step_us"
                      " - simulate(kernels, launch, 'graph', host_other_us=other).step_us"),
    ],
    "ex3": [
        _PARSE_EX3 + ('opts = {"a": eager(kernels, launch / 2, other), "b": eager([k / 2 for k in kernels], launch, other),'
                      ' "c": other + launch + sum(kernels)}\nmy_answer = min(sorted(opts), key=opts.get)'),
        _PARSE_EX3 + ("from simulators.launch import simulate\n"
                      "opts = {'a': simulate(kernels, launch / 2, host_other_us=other).step_us,"
                      " 'b': simulate([k / 2 for k in kernels], launch, host_other_us=other).step_us,"
                      " 'c': simulate(kernels, launch, 'graph', host_other_us=other).step_us}\n"
                      "my_answer = min(sorted(opts), key=opts.get).upper() + ') is the shortest'"),
    ],
    "ex4": [
        _PARSE_EX4 + "my_answer = (params * 2 + batch * context * kv) / bandwidth * 1e6",
        _PARSE_EX4 + ("from simulators.roofline import DecodeModel, floors_us\n"
                      "m = DecodeModel('m', params, 2, layers, 32, 128, kv)\n"
                      "my_answer = f'{floors_us(m, batch, context, bandwidth, 989e12)[0]:.1f}'"),
    ],
    "ex5": [
        _PARSE_EX5 + ("from simulators.roofline import DecodeModel, saturation_batch\n"
                      "m = DecodeModel('x', params, 2, layers, heads, 128, 2 * layers * kv_heads * 128 * 2)\n"
                      "my_answer = nearest(saturation_batch(m, context, 4.8e12, 989e12))"),
        # by hand: 2 P B + 4 L H d C B = ridge (2 P + B C kv), solved for B (attention FLOPs per sequence)
        _PARSE_EX5 + ("ridge = 989e12 / 4.8e12\nkv = 2 * layers * kv_heads * 128 * 2\n"
                      "per_seq = 2 * params + 4 * layers * heads * 128 * context - ridge * context * kv\n"
                      "my_answer = nearest(ridge * 2 * params / per_seq if per_seq > 0 else float('inf'))"),
    ],
    "task": [
        '''def eager_step_us(kernel_us, launch_us, host_other_us):
    host, device = host_other_us, 0.0
    for k in kernel_us:
        host += launch_us
        device = max(device, host) + k
    return device''',
        '''def eager_step_us(kernel_us, launch_us, host_other_us):
    # the last kernel ends after the latest (issue time of operator i + the kernels from i on)
    return max(host_other_us + (i + 1) * launch_us + sum(kernel_us[i:]) for i in range(len(kernel_us)))''',
    ],
    "floor_task": [
        '''def decode_floor(params, bytes_per_param, kv_bytes_per_token, batch, context, bandwidth, peak,
                 flops_per_token):
    bytes_read = params * bytes_per_param + batch * context * kv_bytes_per_token
    floors = {"bandwidth": bytes_read / bandwidth * 1e6, "compute": batch * flops_per_token / peak * 1e6}
    bound = max(floors, key=lambda k: (floors[k], k == "bandwidth"))
    return floors[bound], bound''',
        '''def decode_floor(params, bytes_per_param, kv_bytes_per_token, batch, context, bandwidth, peak,
                 flops_per_token):
    intensity = batch * flops_per_token / (params * bytes_per_param + batch * context * kv_bytes_per_token)
    ridge = peak / bandwidth
    if intensity <= ridge:
        return (params * bytes_per_param + batch * context * kv_bytes_per_token) * 1e6 / bandwidth, "bandwidth"
    return batch * flops_per_token * 1e6 / peak, "compute"''',
    ],
}

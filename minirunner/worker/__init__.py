"""The device side of a step (vLLM's Model Runner V2): persistent request rows (states.py), the step
buffers, input preparation, the model runner, the sampler and the graph manager (cudagraph.py). It never
decides what to schedule, never appends a token to a request and never imports engine/: it reads the
scheduler's output as data (minirunner/core/sched/output.py)."""

"""What the engine and the worker both read (vLLM's ``vllm/v1/core``): the scheduler's output as plain
data (sched/output.py). Nothing here holds a live engine object."""

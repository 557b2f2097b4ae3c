"""Teaching simulators: small, seeded, pure-Python/numpy models of the ideas the course explains.

Owns the OS paging simulator (``simulators.paging``), the KV-cache memory model
(``simulators.kv_memory``), the launch-overhead timeline (``simulators.launch``; its seeded
problems in ``simulators.launch_problems``), the padded
batch ladder (``simulators.buckets``, a leaf the runner may import too) and the exercise/checker
helpers (``simulators.exercises``), and the loader of the one GPU run's results
(``simulators.gpu_results``, read by notebooks 04-07).
Never imports torch or anything of ours: a simulator may only read the runner's results as
plain data.
"""

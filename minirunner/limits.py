"""Limits: the sizes, counts and seeds an engine refuses before it allocates anything.

Owns the type checks of the engine's size options (an int, not a bool, a float or a string), the
memory estimate of what those sizes make the engine allocate (KV cache, block tables, step buffers,
one step's activations) against the machine's (CPU) or the device's (CUDA) memory, the bound on
``n``, the range of seeds and the bound on CPU threads. Each check raises ValueError naming the
option and what to do, in microseconds: nothing is built before they pass.
"""

from __future__ import annotations

import math
import os

import torch

# Completions of one request (SamplingParams.n). vLLM has no hard bound; ours keeps one request's
# bookkeeping (n live requests, n block tables) well inside memory and a step's batch.
MAX_N = 1024
SEED_BOUND = 2**63  # seeds are stored as int64 (the sampling kernel's key): [0, 2**63)
THREADS_PER_CORE = 8  # num_threads above this multiple of the cores only thrashes (or kills libgomp)
_HOST_BYTES_PER_BLOCK = 200  # the block pool's Python bookkeeping per block (lists, free-list entry)


def check_int(name: str, value, minimum: int = 1, optional: bool = False) -> None:
    """``value`` must be an int >= ``minimum`` (None too when ``optional``); bools are refused, not
    taken as 0 / 1, and so are floats and strings, not truncated or parsed."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_finite(name: str, value, low: float | None = None, high: float | None = None) -> float:
    """``value`` must be a real, finite number (inside [low, high] when given); returns it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value!r}")
    return float(value)


def device_memory_bytes(device: torch.device) -> int:
    """The memory an engine on ``device`` can ever use: the GPU's total; on a CPU the machine's RAM, or
    less where this process is capped (a cgroup's memory.max, or the address-space rlimit minus what
    the process maps already)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    caps = [2**62]
    try:
        caps.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass  # no sysconf (Windows): no bound we can state from here
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                caps.append(int(f.read().strip()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            caps.append(max(0, limit - mapped))
    except (ImportError, OSError, ValueError):
        pass
    return min(caps)


def check_threads(num_threads) -> None:
    """num_threads: "auto", None, or an int in [1, THREADS_PER_CORE x cores]."""
    if num_threads in (None, "auto"):
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto', None (leave torch's setting) or an integer "
                         f">= 1, got {num_threads!r}")
    cores = os.cpu_count() or 1
    if num_threads > THREADS_PER_CORE * cores:
        raise ValueError(f"num_threads={num_threads} is more than {THREADS_PER_CORE} per core on this "
                         f"machine ({cores} cores): pass 'auto' (one per core) or at most "
                         f"{THREADS_PER_CORE * cores}")


def check_seed(name: str, seed) -> None:
    """A seed must be an integer in [0, 2**63): larger ones would alias smaller ones (int64 keys)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{name} must be an integer or None, got {seed!r}")
    if not 0 <= seed < SEED_BOUND:
        raise ValueError(f"{name}={seed} is outside [0, 2**63) (seeds are 64-bit keys: a larger one "
                         "would silently act as another); pass a smaller one, or -1 / None for unseeded")


def check_n(n: int) -> None:
    if n > MAX_N:
        raise ValueError(f"n={n} completions is more than this engine allows ({MAX_N}; vLLM has no fixed "
                         f"bound, but each completion is a live request with its own block table): "
                         f"send several requests of n <= {MAX_N} instead")


def _fmt(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def check_engine_memory(config, mc) -> None:
    """Refuse sizes whose allocations alone exceed the device's memory, naming the option.

    Counted: the KV cache when its size is given (``num_kv_blocks`` blocks plus the null block, with
    the pool's host bookkeeping, or ``kv_cache_memory_bytes``), the block tables
    (``max_num_seqs`` x blocks of ``max_model_len``, in the step buffers and the request states), and
    one step's activations and buffers at ``max_num_batched_tokens``. The KV cache may take the whole
    memory; each fixed overhead at most a quarter of it (a KV cache must fit beside it); their sum all of
    it. An estimate, not an accounting: it stops sizes that can never work, in microseconds."""
    memory, where = device_memory_bytes(config.device), (
        "this GPU" if config.device.type == "cuda" else "this machine")
    elem = torch.tensor([], dtype=config.dtype).element_size()
    block_bytes = mc.kv_bytes_per_token(config.dtype) * config.block_size
    blocks_per_seq = -(-config.max_model_len // config.block_size)
    parts = {
        "max_num_seqs / max_model_len (block tables)": 2 * 4 * config.max_num_seqs * (blocks_per_seq + 2),
        "max_num_batched_tokens (one step's buffers and activations)": config.max_num_batched_tokens * (
            6 * 8 + elem * (4 * mc.hidden_size + 3 * mc.intermediate_size)),
    }
    if config.num_kv_blocks is not None:
        parts["num_kv_blocks"] = (config.num_kv_blocks + 1) * (block_bytes + _HOST_BYTES_PER_BLOCK)
    elif config.kv_cache_memory_bytes is not None:
        parts["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
    kv = next((k for k in ("num_kv_blocks", "kv_cache_memory_bytes") if k in parts), None)
    for option, nbytes in parts.items():
        # the KV cache may fill the memory; the fixed overheads must leave room for a KV cache beside them
        share, why = (1, "") if option == kv else (4, " a quarter of")
        if nbytes * share > memory:
            raise ValueError(f"{option.split(' (')[0]} asks for about {_fmt(nbytes)} but{why} {where}'s "
                             f"memory is {_fmt(memory // share)}: lower it ({option})")
    total = sum(parts.values())
    if total > memory:
        raise ValueError(f"together these sizes ask for about {_fmt(total)} but {where} has {_fmt(memory)} "
                         f"of memory: lower one of {', '.join(parts)}")

"""``minirunner bench``: seeded workloads through the runner, with transformers or a contiguous KV layout
side by side in the same run.

Owns the benchmark's entry points (``run_bench`` for Python, ``main`` for the command line), the table it
prints, its JSON and its plot. Figures are for the machine it runs on.
"""

from __future__ import annotations

import gc
import json
import platform
from pathlib import Path

import torch

from minirunner.core.gc_heap import freeze_startup_heap
from minirunner.llm import LLM
from minirunner.tools.bench.run import BenchResult, run_minirunner, run_transformers
from minirunner.tools.bench.workloads import WORKLOADS, Workload, make_workload
from minirunner.worker.compile_cache import cache_dir

# plain / transformers_assisted: for a speculative run (speculative_config given), the same runner
# without speculation, and transformers' assisted generation (the same draft model, or its n-gram prompt
# lookup) at batch size 1.
# synchronous: for an async_scheduling run, the same runner reading every step before the next.
COMPARE = ("transformers", "contiguous", "contiguous_exact", "plain", "transformers_assisted",
           "synchronous", "one_device")
# torch's thread count before any LLM sets its own: the transformers baseline also runs with it.
_DEFAULT_THREADS = torch.get_num_threads()


def environment() -> dict:
    import transformers

    return dict(machine=platform.machine(), processor=platform.processor() or None,
                python=platform.python_version(), torch=torch.__version__,
                transformers=transformers.__version__, torch_threads=torch.get_num_threads(),
                cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                compile_cache=str(cache_dir()).replace(str(Path.home()), "~", 1))  # no home path in reports


def run_bench(model: str | None = None, workload: str = "nano", num_requests: int = 64,
              input_len: tuple[int, int] = (100, 1024), output_len: tuple[int, int] = (100, 1024),
              seed: int = 0, compare: tuple[str, ...] | list[str] = (), hf_batch_size: int = 16,
              use_tqdm: bool = False, warmup: str = "short", **llm_kwargs) -> dict:
    """Run ``workload`` through minirunner (``llm_kwargs`` go to ``LLM``), then each ``compare`` entry on
    the same prompts: ``transformers`` (``generate`` in static batches of ``hf_batch_size``),
    ``contiguous`` / ``contiguous_exact`` (the same runner reserving max_model_len / prompt + max_tokens
    per request in a KV cache of the same size); with ``speculative_config``: ``plain`` (the same runner
    without speculation) and ``transformers_assisted`` (assisted generation on the same draft or n-gram
    lookup, batch size 1); with ``async_scheduling``: ``synchronous`` (the same runner
    without it); with ``tensor_parallel_size`` > 1: ``one_device`` (the same runner unsharded).
    ``warmup``: "short" (two 8-token requests through each engine before its timed
    run, and a 2-token generate for transformers) or "workload" (the whole workload once, untimed, through
    every engine: the timed runs then meet no first-time costs, e.g. allocations at lengths the short
    warm-up never reached; ``graph_mode="compile"`` always warms with the workload, since every bucket
    compiles on first use). Returns plain data: settings, results, ratios (the first run over each other;
    with both transformers runs, also assisted over plain generate)."""
    if warmup not in ("short", "workload"):
        raise ValueError(f"warmup must be 'short' or 'workload', got {warmup!r}")
    for c in compare:
        if c not in COMPARE:
            raise ValueError(f"unknown --compare {c!r}; choose from {list(COMPARE)}")
    spec = llm_kwargs.get("speculative_config")
    if spec is None and {"plain", "transformers_assisted"} & set(compare):
        raise ValueError("--compare plain / transformers_assisted compare a speculative run: give "
                         "--speculative-config too")
    if "synchronous" in compare and not llm_kwargs.get("async_scheduling"):
        raise ValueError("--compare synchronous compares an async_scheduling run with the same runner "
                         "without it: give --async-scheduling too")
    if llm_kwargs.get("kv_layout", "paged") != "paged" and any(c.startswith("contig") for c in compare):
        raise ValueError("compare with a contiguous layout from the paged one (kv_layout='paged')")
    tp = llm_kwargs.get("tensor_parallel_size", 1)
    if "one_device" in compare and tp == 1:
        raise ValueError("--compare one_device compares a sharded run with one device: give "
                         "--tensor-parallel-size 2 (or more) too")
    freeze_startup_heap()  # a whole-process job, like the CLI: engines built below stay collectable
    llm = LLM(model, **llm_kwargs)
    cfg, mc = llm.engine.config, llm.engine.model_config
    wl = make_workload(workload, num_requests, mc.vocab_size, cfg.max_model_len, seed, input_len,
                       output_len, tokenizer=llm.get_tokenizer())
    warm = make_workload("fixed", 2, mc.vocab_size, cfg.max_model_len, seed, (8, 8), (4, 4))
    if cfg.graph_mode == "compile" or warmup == "workload":
        # (compile: every bucket and verify k the run uses compiles on first use, for seconds each, so
        # the timed run must replay compiled steps only)
        warm = wl
    hf_warm = warmup == "workload"
    run_minirunner(llm, warm)
    if spec is None:
        label = f"minirunner ({cfg.kv_layout}{f', tensor_parallel_size={tp}' if tp > 1 else ''})"
    else:
        sc = llm.engine.spec.config
        how = f"{sc.method} k={sc.num_speculative_tokens}"
        label = f"minirunner ({cfg.kv_layout}, {how}{', async' if cfg.async_scheduling else ''})"
    results = [run_minirunner(llm, wl, label, use_tqdm)]
    num_kv_blocks = llm.engine.num_kv_blocks
    # On a GPU its KV cache took the free memory: every run compared below needs it back.
    llm = None
    _release_device_memory(cfg.device)
    threads = tuple(sorted({1, _DEFAULT_THREADS}))
    for c in compare:
        if c == "transformers":
            results.append(run_transformers(cfg.model, wl, hf_batch_size, cfg.dtype, cfg.device,
                                            f"transformers generate (static batches of {hf_batch_size})",
                                            threads=threads, warm_all=hf_warm))
        elif c == "transformers_assisted":  # sc: the speculative run's config (spec is given)
            draft = sc.model if sc.method == "draft_model" else None
            lookup = sc.num_speculative_tokens if sc.method == "ngram" else None
            how = "draft model" if draft else f"prompt lookup, {lookup} tokens"
            results.append(run_transformers(cfg.model, wl, 1, cfg.dtype, cfg.device,
                                            f"transformers assisted generate ({how}, batch 1)",
                                            threads=threads, assistant_dir=draft,
                                            prompt_lookup_num_tokens=lookup, warm_all=hf_warm))
        else:
            layout = "paged" if c in ("plain", "synchronous", "one_device") else c
            kw = dict(llm_kwargs, kv_layout=layout, num_kv_blocks=num_kv_blocks,
                      async_scheduling=False)
            name = f"minirunner ({layout})"
            if c == "plain":
                kw.pop("speculative_config")
                name = "minirunner (paged, no speculation)"
            elif c == "synchronous":
                name = f"minirunner (paged, {how}, synchronous)"
            elif c == "one_device":
                kw["tensor_parallel_size"] = 1
                name = "minirunner (paged, one device)"
            kw.pop("kv_cache_memory_bytes", None)
            other = LLM(model, **kw)
            run_minirunner(other, warm)
            results.append(run_minirunner(other, wl, name, use_tqdm))
            other = None
            _release_device_memory(cfg.device)
    base = results[0]
    ratios = {}
    for r in results[1:]:
        ratios[r.label] = dict(
            output_tok_per_s=base.output_tok_per_s / r.output_tok_per_s,
            peak_concurrent_seqs=(base.peak_concurrent_seqs / r.peak_concurrent_seqs
                                  if r.peak_concurrent_seqs else None))
    # transformers' own speed-up from assisted generation, when both of its runs are in this one
    hf_runs = {c: r for c, r in zip(compare, results[1:], strict=True)
               if c in ("transformers", "transformers_assisted")}
    assisted = None
    if len(hf_runs) == 2:
        plain_hf, assisted_hf = hf_runs["transformers"], hf_runs["transformers_assisted"]
        assisted = dict(label=f"{assisted_hf.label} vs {plain_hf.label}",
                        output_tok_per_s=assisted_hf.output_tok_per_s / plain_hf.output_tok_per_s)
    return dict(workload=dict(name=wl.name, description=wl.description, num_requests=len(wl),
                              prompt_tokens=wl.num_prompt_tokens, output_tokens=wl.num_output_tokens,
                              seed=seed),
                warmup="workload" if warm is wl else "short",
                environment=environment(), results=[r.as_dict() for r in results], ratios=ratios,
                transformers_assisted_speedup=assisted)



def _release_device_memory(device) -> None:
    """Free what a dropped engine held on a GPU (its KV cache, graphs' pool) for the next run."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def format_table(report: dict) -> str:
    cols = [("output tok/s", "output_tok_per_s", "{:.1f}"), ("total tok/s", "total_tok_per_s", "{:.1f}"),
            ("TTFT p50 s", "ttft_p50", "{:.3f}"), ("TTFT p99 s", "ttft_p99", "{:.3f}"),
            ("TPOT p50 ms", "tpot_p50", "ms"), ("TPOT p99 ms", "tpot_p99", "ms"),
            ("peak seqs", "peak_concurrent_seqs", "{}"), ("KV util", "kv_utilization_mean", "{:.1%}"),
            ("preempt", "num_preemptions", "{}"), ("cached", "cached_prompt_tokens", "{}")]

    def cell(value, fmt):
        if value is None:
            return "-"
        return f"{value * 1e3:.2f}" if fmt == "ms" else fmt.format(value)

    rows = [["run"] + [c[0] for c in cols]]
    rows += [[r["label"]] + [cell(r[key], fmt) for _, key, fmt in cols] for r in report["results"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"workload: {report['workload']['description']} "
             f"({report['workload']['prompt_tokens']} prompt + {report['workload']['output_tokens']} "
             "output tokens)"]
    for row in rows:
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(cells)))
    for label, ratio in report["ratios"].items():
        conc = ratio["peak_concurrent_seqs"]
        lines.append(f"minirunner vs {label}: {ratio['output_tok_per_s']:.2f}x output tok/s"
                     + (f", {conc:.2f}x peak concurrent sequences" if conc else ""))
    for r in report["results"]:
        sp = r.get("speculative")
        if sp and sp.get("alpha") is not None:
            lines.append(f"{r['label']}: acceptance alpha {sp['alpha']:.2f}, mean accepted length "
                         f"{sp['mean_accepted_length']:.2f} tokens per target pass")
    assisted = report.get("transformers_assisted_speedup")
    if assisted:
        lines.append(f"{assisted['label']}: {assisted['output_tok_per_s']:.2f}x output tok/s")
    folder = report["environment"].get("compile_cache")
    if folder:
        lines.append(f"compiled steps (graph_mode='compile') are cached in {folder} "
                     "(MINIRUNNER_COMPILE_CACHE)")
    return "\n".join(lines)


def plot_report(report: dict, path: str | Path) -> None:
    """Output throughput (tok/s over a sliding window of steps) and KV utilisation over time, per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in report["results"]:
        tl = r.get("timeline") or {}
        if not tl.get("t"):
            continue
        t, out = np.asarray(tl["t"]), np.asarray(tl["output_tokens"], dtype=float)
        w = max(1, len(t) // 50)
        dt = np.diff(np.concatenate([[0.0], t]))
        rate = np.convolve(out, np.ones(w), "same") / np.maximum(np.convolve(dt, np.ones(w), "same"), 1e-9)
        ax1.step(t, rate, where="post", label=r["label"])
        util = [np.nan if u is None else u for u in tl["kv_utilization"]]
        ax2.step(t, util, where="post", label=r["label"])
    ax1.set_ylabel("output tok/s")
    ax2.set_ylabel("KV utilisation\n(slots holding tokens)")
    ax2.set_xlabel("seconds")
    ax2.set_ylim(0, 1.05)
    ax1.legend(fontsize=8)
    ax1.set_title(report["workload"]["description"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["BenchResult", "WORKLOADS", "Workload", "format_table", "make_workload", "plot_report",
           "run_bench", "run_minirunner", "run_transformers"]


def write_json(report: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1) + "\n")

"""Benchmark runs: one workload through minirunner (paged or contiguous KV) or transformers ``generate``,
measured the same way, so the figures can sit side by side.

Owns timing and the metrics of one run (throughput, TTFT and time per output token percentiles, peak
concurrent sequences, KV utilisation sampled per step, preemptions, prefix-cache hits). Never changes how
the engine schedules or computes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from minirunner.llm import LLM
from minirunner.sampling_params import SamplingParams
from minirunner.tools.bench.workloads import Workload


@dataclass
class BenchResult:
    """Figures of one run. Times in seconds; tok/s count useful tokens only (no padding, no tokens a
    static batch generates past a request's own max_tokens). ``None`` = not measurable for this engine."""

    label: str
    engine: str
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    seconds: float
    output_tok_per_s: float
    total_tok_per_s: float
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    peak_concurrent_seqs: int | None
    kv_utilization_mean: float | None
    kv_utilization_min: float | None
    num_preemptions: int | None
    cached_prompt_tokens: int | None
    settings: dict = field(default_factory=dict)
    # speculative runs: the SpecStats of the timed run (alpha, mean accepted length, propose/verify s)
    speculative: dict | None = None
    timeline: dict = field(default_factory=dict, repr=False)

    def as_dict(self, with_timeline: bool = True) -> dict:
        d = asdict(self)
        if not with_timeline:
            d.pop("timeline")
        return d


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _timing(workload: Workload, out_tokens: int, seconds: float, ttft: list[float],
            tpot: list[float]) -> dict:
    """The throughput and latency fields every run reports the same way."""
    return dict(num_requests=len(workload), prompt_tokens=workload.num_prompt_tokens,
                output_tokens=out_tokens, seconds=seconds, output_tok_per_s=out_tokens / seconds,
                total_tok_per_s=(out_tokens + workload.num_prompt_tokens) / seconds,
                ttft_p50=_pct(ttft, 50), ttft_p99=_pct(ttft, 99), tpot_p50=_pct(tpot, 50),
                tpot_p99=_pct(tpot, 99))


def run_minirunner(llm: LLM, workload: Workload, label: str = "minirunner",
                   use_tqdm: bool = False) -> BenchResult:
    """Run every request of the workload through ``llm`` at once (offline: all arrive at t = 0)."""
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in workload.max_tokens]
    llm.clear_step_trace()
    spec = llm.engine.spec
    if spec is not None:
        spec.reset_stats()  # metrics of this run only
    start = time.perf_counter()
    # A request the engine refuses (too long for max_model_len or the KV pool) raises ValueError
    # naming it before anything runs.
    outs = llm.generate(workload.prompts, params, use_tqdm=use_tqdm)
    seconds = time.perf_counter() - start
    trace = llm.get_step_trace()
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    ttft = [o.metrics.time_to_first_token for o in outs]
    tpot = [o.metrics.decode_time / (len(o.outputs[0].token_ids) - 1)
            for o in outs if len(o.outputs[0].token_ids) > 1]
    util = [t["kv_slots_used"] / t["kv_slots_allocated"] for t in trace if t["kv_slots_allocated"]]
    cfg = llm.engine.config
    return BenchResult(
        label=label, engine="minirunner", **_timing(workload, out_tokens, seconds, ttft, tpot),
        peak_concurrent_seqs=max(t["num_running"] for t in trace),
        kv_utilization_mean=float(np.mean(util)) if util else None,
        kv_utilization_min=float(np.min(util)) if util else None,
        num_preemptions=sum(t["num_preempted"] for t in trace),
        cached_prompt_tokens=sum(o.metrics.num_cached_prompt_tokens for o in outs),
        settings=dict(kv_layout=cfg.kv_layout, block_size=cfg.block_size,
                      num_kv_blocks=llm.engine.num_kv_blocks, max_num_seqs=cfg.max_num_seqs,
                      max_num_batched_tokens=cfg.max_num_batched_tokens, max_model_len=cfg.max_model_len,
                      backend=llm.engine.backend.name, dtype=str(cfg.dtype), device=str(cfg.device),
                      prefix_caching=cfg.enable_prefix_caching, threads=llm.engine.num_threads,
                      graph_mode=cfg.graph_mode, speculative_config=cfg.speculative_config),
        speculative=None if spec is None else spec.stats.as_dict(),
        timeline=dict(
            t=np.cumsum([t["duration_s"] for t in trace]).tolist(),
            output_tokens=[t["num_output_tokens"] for t in trace],
            kv_utilization=[t["kv_slots_used"] / t["kv_slots_allocated"] if t["kv_slots_allocated"]
                            else None for t in trace],
            running=[t["num_running"] for t in trace]),
    )


class _StepClock:
    """A transformers streamer that only notes when each token of a row arrives: ``times[i]`` for token
    i (assisted generation hands over several tokens at once; they share the time)."""

    def __init__(self, batch_size: int):
        self.times: list[float] = []
        self.batch_size = batch_size
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first hands the streamer the prompt
            self._prompt_seen = True
            return
        self.times += [time.perf_counter()] * max(1, value.numel() // self.batch_size)

    def end(self) -> None:
        pass


def run_transformers(model_dir: str, workload: Workload, batch_size: int, dtype: torch.dtype,
                     device: torch.device, label: str = "transformers",
                     threads: tuple[int, ...] = (), assistant_dir: str | None = None,
                     prompt_lookup_num_tokens: int | None = None, warm_all: bool = False) -> BenchResult:
    """The same prompts through transformers ``generate`` (greedy, EOS ignored) in static batches of
    ``batch_size``, left-padded, each batch generating its longest request's max_tokens. Only each
    request's own max_tokens count as output. ``threads``: on a CPU, run once with each torch thread
    count and keep the fastest (the baseline at its best); the others are in ``settings``.
    Assisted generation (batch size 1 only): ``assistant_dir`` a draft model, or
    ``prompt_lookup_num_tokens`` transformers' n-gram prompt lookup. ``warm_all``: run every batch once,
    untimed, before the timed run (False: one 2-token generate)."""
    if threads and device.type == "cpu":
        before, runs = torch.get_num_threads(), []
        try:
            for n in threads:
                torch.set_num_threads(n)
                runs.append(run_transformers(model_dir, workload, batch_size, dtype, device, label,
                                             (), assistant_dir, prompt_lookup_num_tokens, warm_all))
        finally:
            torch.set_num_threads(before)
        best = max(runs, key=lambda r: r.output_tok_per_s)
        best.settings["threads_tried"] = {n: r.output_tok_per_s for n, r in zip(threads, runs, strict=True)}
        return best
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    # Greedy with nothing else: the checkpoint's own generation config (max_length, sampling
    # defaults) would only make generate warn on every batch that max_new_tokens overrides it.
    model.generation_config = _greedy_config(model.generation_config)
    assist: dict = {}
    if assistant_dir is not None:
        assist["assistant_model"] = AutoModelForCausalLM.from_pretrained(
            assistant_dir, dtype=dtype).to(device).eval()
    if prompt_lookup_num_tokens is not None:
        assist["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    if "assistant_model" in assist:
        assist["assistant_model"].generation_config = _greedy_config(
            assist["assistant_model"].generation_config)
    if assist and batch_size != 1:
        raise ValueError("transformers' assisted generation runs one request at a time: batch size 1")
    pad = 0
    ttft, tpot = [], []

    def generate(prompts, new_tokens):
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        clock = _StepClock(len(prompts))
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad, streamer=clock,
                           **assist)
        return clock.times

    batches = [(workload.prompts[lo:lo + batch_size], workload.max_tokens[lo:lo + batch_size])
               for lo in range(0, len(workload), batch_size)]
    if warm_all:
        for prompts, wants in batches:
            generate(prompts, max(wants))
    else:
        generate(workload.prompts[:1], 2)  # warm-up
    start = time.perf_counter()
    for prompts, wants in batches:
        times = generate(prompts, max(wants))
        for m in wants:  # a request's tokens are the first m of its row
            ttft.append(times[0] - start)
            if m > 1:
                tpot.append((times[m - 1] - times[0]) / (m - 1))
    seconds = time.perf_counter() - start
    out_tokens = workload.num_output_tokens
    return BenchResult(
        label=label, engine="transformers", **_timing(workload, out_tokens, seconds, ttft, tpot),
        peak_concurrent_seqs=min(batch_size, len(workload)), kv_utilization_mean=None,
        kv_utilization_min=None, num_preemptions=None, cached_prompt_tokens=None,
        settings=dict(batch_size=batch_size, padding="left", dtype=str(dtype), device=str(device),
                      threads=torch.get_num_threads(), assistant=assistant_dir,
                      prompt_lookup_num_tokens=prompt_lookup_num_tokens),
    )


def _greedy_config(config):
    """A GenerationConfig with only the checkpoint's special token ids (greedy, no length limit)."""
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                            pad_token_id=config.pad_token_id, do_sample=False)

"""EngineMetrics: the engine's one set of Prometheus-style metrics, under vLLM's names and meanings.

Owns the counters, gauges and histograms that ``LLM.get_metrics()`` and the server's ``/metrics`` read.
The engine records at step boundaries (scheduling, a step applied, a request finished or aborted); the
scheduler records prefix-cache lookups at admission. Every update and ``snapshot()`` hold one lock, so
a server thread reading while a loop thread steps gets a consistent copy.
"""

from __future__ import annotations

import bisect
import threading
import time

from minirunner.metrics.reader import Counter, Gauge, Histogram, Metric, Vector

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py), so dashboards built for vLLM read ours unchanged.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's bounds for token-count histograms: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    bounds, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(bounds)
            bounds.append(float(m * scale))
        scale *= 10


FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason, each label always present

_COUNTERS = {  # name -> documentation (vLLM's HELP text)
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
}
_SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
}
_TOKEN_HISTOGRAMS = {  # name -> documentation; bounds from max_model_len
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
}
_HISTOGRAMS = {  # name -> (bucket bounds, documentation)
    "vllm:time_to_first_token_seconds": (TTFT_BUCKETS, "Histogram of time to first token in seconds."),
    "vllm:inter_token_latency_seconds": (ITL_BUCKETS, "Histogram of inter-token latency in seconds."),
    "vllm:e2e_request_latency_seconds": (E2E_BUCKETS, "Histogram of e2e request latency in seconds."),
    # vLLM's request phases: queued -> scheduled -> first token -> last token
    "vllm:request_queue_time_seconds": (E2E_BUCKETS, "Histogram of time spent in WAITING phase for request."),
    "vllm:request_prefill_time_seconds": (E2E_BUCKETS,
                                          "Histogram of time spent in PREFILL phase for request."),
    "vllm:request_decode_time_seconds": (E2E_BUCKETS, "Histogram of time spent in DECODE phase for request."),
    "vllm:request_inference_time_seconds": (E2E_BUCKETS,
                                            "Histogram of time spent in RUNNING phase for request."),
    "vllm:request_time_per_output_token_seconds": (
        ITL_BUCKETS, "Histogram of time_per_output_token_seconds per request."),
}


class _Buckets:
    """One histogram's observations: a count per bucket (not cumulative; the snapshot adds them up)."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: a value on a bound counts in it
        self.sum += value

    def cumulative(self) -> dict[str, int]:
        out, total = {}, 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            total += n
            out[bound] = total
        return out


class EngineMetrics:
    """``model_name``: the ``model_name`` label; ``prefix_caching``: whether admissions query the prefix
    cache; ``num_speculative_tokens``: k with speculative decoding (its metrics appear only then, as
    vLLM's), else None; ``max_model_len`` bounds the token-count histograms' buckets."""

    def __init__(self, model_name: str, prefix_caching: bool, num_speculative_tokens: int | None = None,
                 max_model_len: int = 2048):
        self._lock = threading.Lock()
        self.labels = {"engine": "0", "model_name": model_name}
        self.prefix_caching = prefix_caching
        self.speculative = num_speculative_tokens is not None
        self._counters = dict.fromkeys([*_COUNTERS, *(_SPEC_COUNTERS if self.speculative else ())], 0)
        self._accepted_per_pos = [0] * (num_speculative_tokens or 0)
        self._success = dict.fromkeys(FINISH_REASONS, 0)
        self._histograms = {name: _Buckets(bounds) for name, (bounds, _) in _HISTOGRAMS.items()}
        token_bounds = build_1_2_5_buckets(max_model_len)
        self._histograms.update({name: _Buckets(token_bounds) for name in _TOKEN_HISTOGRAMS})
        self._gauges = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0,
                        "vllm:kv_cache_usage_perc": 0.0}
        self._last_token_time: dict[str, float] = {}  # request id -> when its latest tokens arrived
        self._scheduled_time: dict[str, float] = {}  # request id -> when it was first scheduled

    @classmethod
    def for_engine(cls, config, spec_config) -> EngineMetrics:
        """The metrics of an engine with this EngineConfig (validated) and SpeculativeConfig (or None)."""
        return cls(config.model, config.enable_prefix_caching and config.kv_layout == "paged",
                   None if spec_config is None else spec_config.max_num_speculative_tokens,
                   config.max_model_len)

    # -- recording (engine and scheduler) --------------------------------------------------------
    def record_admission(self, request, num_cached_tokens: int) -> None:
        """A request admitted for the first time (never preempted, holding no blocks before): vLLM's
        prefix-cache query of its tokens and hit of ``num_cached_tokens``. A request asking for prompt
        logprobs never reads the cache (every prompt position must run), so it is no query. Also the
        end of its queue time."""
        now = time.perf_counter()
        with self._lock:
            self._scheduled_time[request.request_id] = now
            self._histograms["vllm:request_queue_time_seconds"].observe(now - request.arrival_time)
        if not self.prefix_caching or request.params.prompt_logprobs is not None:
            return
        with self._lock:
            self._counters["vllm:prefix_cache_queries"] += request.num_tokens
            self._counters["vllm:prefix_cache_hits"] += num_cached_tokens

    def record_schedule(self, num_preempted: int) -> None:
        """A step was scheduled, preempting ``num_preempted`` running requests."""
        if num_preempted:
            with self._lock:
                self._counters["vllm:num_preemptions"] += num_preempted

    def record_step(self, produced, spec_runs: dict[str, list[int]], scheduler, pool) -> None:
        """A step was applied and its finished requests freed: ``produced`` is (request, tokens appended)
        per request that sampled (those that finished included); ``spec_runs`` is {request id: [drafts
        verified, drafts accepted]}. A request's first tokens count its prompt (vLLM counts prompt tokens
        once the prefill is done) and observe its time to first token; later steps observe the time since
        its previous tokens (one inter-token latency per step, as vLLM's). Then the gauges."""
        now = time.perf_counter()
        with self._lock:
            for request, tokens in produced:
                if not tokens:
                    continue
                self._counters["vllm:generation_tokens"] += len(tokens)
                rid = request.request_id
                last = self._last_token_time.get(rid)
                if last is None and len(request.output_token_ids) == len(tokens):
                    self._counters["vllm:prompt_tokens"] += len(request.prompt_token_ids)
                    self._histograms["vllm:time_to_first_token_seconds"].observe(
                        request.first_token_time - request.arrival_time)
                elif last is not None:
                    self._histograms["vllm:inter_token_latency_seconds"].observe(now - last)
                if not request.is_finished:
                    self._last_token_time[rid] = now
            if self.speculative:
                for k, accepted in spec_runs.values():
                    self._counters["vllm:spec_decode_num_drafts"] += 1
                    self._counters["vllm:spec_decode_num_draft_tokens"] += k
                    self._counters["vllm:spec_decode_num_accepted_tokens"] += accepted
                    per_pos = self._accepted_per_pos
                    per_pos.extend([0] * (accepted - len(per_pos)))
                    for j in range(accepted):
                        per_pos[j] += 1
            for request, _ in produced:
                if request.is_finished:
                    self._finished(request)
            self._set_state(scheduler, pool)

    def record_finished(self, request, num_dropped_tokens: int = 0) -> None:
        """A request finished outside a step (aborted, or a stop string found outside the engine: the
        ``num_dropped_tokens`` it produced after that string are taken back from the token count)."""
        with self._lock:
            self._counters["vllm:generation_tokens"] -= num_dropped_tokens
            self._finished(request)

    def _finished(self, request) -> None:
        self._last_token_time.pop(request.request_id, None)
        reason = request.finish_reason if request.finish_reason in self._success else "error"
        self._success[reason] += 1
        if request.finish_time is not None:
            self._histograms["vllm:e2e_request_latency_seconds"].observe(
                request.finish_time - request.arrival_time)
        self._histograms["vllm:request_prompt_tokens"].observe(len(request.prompt_token_ids))
        self._histograms["vllm:request_generation_tokens"].observe(len(request.output_token_ids))
        scheduled = self._scheduled_time.pop(request.request_id, None)
        first, last = request.first_token_time, request.finish_time
        if scheduled is None or first is None or last is None:
            return  # never ran (aborted while waiting), or a forked sibling
        h = self._histograms
        h["vllm:request_prefill_time_seconds"].observe(first - scheduled)
        h["vllm:request_decode_time_seconds"].observe(last - first)
        h["vllm:request_inference_time_seconds"].observe(last - scheduled)
        if len(request.output_token_ids) > 1:
            h["vllm:request_time_per_output_token_seconds"].observe(
                (last - first) / (len(request.output_token_ids) - 1))

    def record_state(self, scheduler, pool) -> None:
        """The gauges, from the scheduler's queues and the block pool now (after a step, or an abort).
        KV-cache usage is vLLM's: the share of blocks not free (a cached block nobody holds is free)."""
        with self._lock:
            self._set_state(scheduler, pool)

    def _set_state(self, scheduler, pool) -> None:
        self._gauges["vllm:num_requests_running"] = float(len(scheduler.running))
        self._gauges["vllm:num_requests_waiting"] = float(len(scheduler.waiting))
        self._gauges["vllm:kv_cache_usage_perc"] = pool.num_used_blocks / pool.num_blocks

    # -- reading -------------------------------------------------------------------------------
    def snapshot(self) -> list[Metric]:
        """Every metric now, as fresh records (nothing shared with the live counts)."""
        with self._lock:
            labels = self.labels
            out: list[Metric] = [Gauge(name, dict(labels), value, documentation=_GAUGE_DOCS[name])
                                 for name, value in self._gauges.items()]
            for name, value in self._counters.items():
                doc = _COUNTERS.get(name) or _SPEC_COUNTERS[name]
                out.append(Counter(name, dict(labels), value, documentation=doc))
            out.extend(Counter("vllm:request_success", {**labels, "finished_reason": reason}, n,
                               documentation="Count of successfully processed requests.")
                       for reason, n in self._success.items())
            if self.speculative:
                out.append(Vector("vllm:spec_decode_num_accepted_tokens_per_pos", dict(labels),
                                  list(self._accepted_per_pos),
                                  documentation="Accepted tokens per draft position."))
            for name, h in self._histograms.items():
                doc = _TOKEN_HISTOGRAMS.get(name) or _HISTOGRAMS[name][1]
                out.append(Histogram(name, dict(labels), sum(h.counts), h.sum, h.cumulative(),
                                     documentation=doc))
        return out


_GAUGE_DOCS = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}

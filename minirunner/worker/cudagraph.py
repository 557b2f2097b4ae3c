"""Graph-ready decode: the bucket ladder and one compiled (CPU) or captured (CUDA) decode step per bucket.

Owns which decode batches run as one replay, the per-bucket step functions (the decode step, and the
uniform verify step of speculative decoding: every request at k + 1 query tokens, the rejection sampler
inside the graph), their compilation
(``torch.compile(dynamic=False)``, lazily per bucket) or capture (``torch.cuda.CUDAGraph``, largest bucket
first, after a warm-up on a side stream, one shared memory pool), and replay. A step reads everything
from the runner's static buffers (token ids, positions, slots, seq_lens, full-width block tables,
temperatures, top-k, top-p, seeds, sample positions) and writes nothing but the KV cache and its outputs.
It must never sync with the host, allocate outside the step's own pool, or read a buffer row that the
runner did not write for this step (the runner writes every row of the bucket, padding rows included).
Prefill, mixed steps, verify steps of unequal k and batches above the largest bucket stay eager (the
runner decides).
"""

from __future__ import annotations

import bisect
import types
from collections.abc import Callable, Sequence

import torch

from kernels._triton import HAS_TRITON
from kernels.rejection_sampling import rejection_sample, rejection_sample_ref
from kernels.sampling import sample, sample_ref

GRAPH_MODES = ("auto", "none", "cuda", "compile")
# The sampler compiled/captured for a bucket: an all-greedy batch is one argmax; "sample" is the seeded
# Gumbel sampler (greedy rows keep their argmax); "filter" adds the top-k / top-p sort. All three are
# static-shape device code, so even the sort is captured; it is a separate variant only because it costs
# a full-vocabulary sort per row that greedy and plain temperature batches should not pay.
SAMPLER_KINDS = ("greedy", "sample", "filter")
# A verify step's sampler: the rejection sampler over the k + 1 rows of every request, with the draft
# model's q read from a static buffer ("verify") or one-hot drafts (n-gram: "verify_onehot"). Greedy,
# temperature and top-k / top-p rows are all handled inside it.
VERIFY_KINDS = ("verify", "verify_onehot")
# "greedy" also runs at query_len q > 1: a uniform multi-token step returning every token row's argmax and
# logits (the draft model's 2-token first pass of a step scheduled ahead, spec_decode/async_loop.py).
# Inductor's freezing folds the weights into the compiled step as constants and prepacks them for the
# CPU's matmul kernels: measured on the embedded model at batch 1 it is what makes "compile" beat eager
# by more than removing dispatch alone (benchmarks/graphs.py). The price: weights changed after a bucket
# compiled are not seen by it (minirunner never changes weights after loading).
COMPILE_OPTIONS: dict = {"freezing": True}


def capture_sizes(max_num_seqs: int, sizes: Sequence[int] | None = None) -> list[int]:
    """The bucket ladder: ``sizes`` (sorted, deduplicated, checked), or by default [1, 2, 4, 8] then
    multiples of 8 up to ``max_num_seqs`` (vLLM's default ladder shape)."""
    if sizes is None:
        ladder = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
        return ladder + list(range(16, max_num_seqs + 1, 8))
    sizes = list(sizes)
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise ValueError(f"cudagraph_capture_sizes must be a non-empty list of integers >= 1, got {sizes!r}")
    too_big = [s for s in sizes if s > max_num_seqs]
    if too_big:
        raise ValueError(f"cudagraph_capture_sizes {too_big} exceed max_num_seqs={max_num_seqs}: a decode "
                         "batch never gets that large; drop them or raise max_num_seqs")
    return sorted(set(sizes))


def bucket_for(batch_size: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size >= batch_size, or None (the batch runs eager). ``sizes`` sorted."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


def resolve_graph_mode(graph_mode: str, device: torch.device) -> str:
    """``auto``: cuda on a CUDA device, none on a CPU (compile is opt-in: it costs seconds per bucket)."""
    if graph_mode not in GRAPH_MODES:
        raise ValueError(f"graph_mode must be one of {list(GRAPH_MODES)}, got {graph_mode!r}")
    if graph_mode == "auto":
        return "cuda" if device.type == "cuda" else "none"
    if graph_mode == "cuda" and device.type != "cuda":
        raise ValueError("graph_mode='cuda' needs a CUDA device; on a CPU use graph_mode='compile' "
                         "(torch.compile per bucket) or 'none'")
    return graph_mode


def _own_code(fn: Callable, name: str) -> Callable:
    """A copy of ``fn`` with its own code object. Dynamo keeps its compiled entries per code object, and
    every bucket's step is a closure of one ``def``: shared, the buckets would pile up as recompiles of
    one frame and pass the recompile limit (8), after which dynamo silently runs eager."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


class DecodeGraphs:
    """One decode step per (bucket size, sampler kind), compiled or captured, replayed by ``run``.

    ``runner`` is the ModelRunner whose static buffers the steps read; ``mode`` is "compile" or "cuda";
    ``max_draft_tokens``: the largest k a verify step may carry (0: no speculative decoding), which sizes
    the static buffer of the draft model's q ([largest bucket * k, vocab] fp32, made on first use).
    A step is keyed by (bucket size, sampler kind, query length): 1 for decode, k + 1 for verify.
    """

    def __init__(self, runner, mode: str, sizes: Sequence[int], max_draft_tokens: int = 0):
        if mode not in ("compile", "cuda"):
            raise ValueError(f"DecodeGraphs runs graph_mode 'compile' or 'cuda', not {mode!r}")
        # vLLM caps cudagraph_capture_sizes by max_num_batched_tokens: a bucket's rows are token rows of
        # the static buffers, so a bucket larger than the token budget could never be written.
        self.max_tokens = runner.input_ids.shape[0]
        self.runner, self.mode = runner, mode
        self.sizes = [s for s in sizes if s <= self.max_tokens]
        self._steps: dict[tuple[int, str, int], Callable[[], tuple[torch.Tensor, torch.Tensor]]] = {}
        self._graphs: dict[tuple[int, str, int], tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self.max_draft_tokens = max_draft_tokens
        self._draft_probs: torch.Tensor | None = None
        self._verify_cu: dict[tuple[int, int], torch.Tensor] = {}
        self.num_compiled = 0  # buckets compiled or captured so far (a notebook shows the cost)
        self._pool = None
        backend = runner.backend
        if not backend.supports_graphs:
            raise ValueError(f"attention_backend={backend.name!r} has no capturable plan; use "
                             "graph_mode='none'")
        if mode == "compile" and backend.name != "torch":
            raise ValueError(f"graph_mode='compile' traces the step with torch.compile, which needs "
                             f"attention_backend='torch' (got {backend.name!r}); use graph_mode='cuda' "
                             "for the triton/flashinfer kernels on a GPU")
        if hasattr(backend, "split_decode_by_length"):
            backend.split_decode_by_length = False  # one static decode group, whatever the lengths

    def bucket(self, batch_size: int, query_len: int = 1) -> int | None:
        """The bucket a uniform step of ``batch_size`` requests at ``query_len`` tokens each replays, or
        None (eager): the smallest size >= batch_size whose padded rows fit the static token buffers.
        The one rule for decode, verify and the draft's multi-token passes alike."""
        size = bucket_for(batch_size, self.sizes)
        if size is None or size * query_len > self.max_tokens:
            return None
        return size

    def verify_bucket(self, batch_size: int, k: int) -> int | None:
        """The bucket of a uniform verify step of ``batch_size`` requests with k drafts each, or None
        (eager): k within max_draft_tokens, the backend's plan takes it, its tokens fit the buffers."""
        if not (1 <= k <= self.max_draft_tokens) or not self.runner.backend.supports_verify_graphs:
            return None
        return self.bucket(batch_size, k + 1)

    def draft_probs_buffer(self) -> torch.Tensor:
        """The static [largest bucket * max_draft_tokens, vocab] fp32 buffer a "verify" step reads the
        draft's q from (rows request after request, k per request; zeros where nothing was written, which
        the sampler reads as q = 0: never accepted)."""
        if self._draft_probs is None:
            r = self.runner
            self._draft_probs = torch.zeros(max(self.sizes, default=0) * self.max_draft_tokens,
                                            r.model.config.vocab_size, dtype=torch.float32,
                                            device=r.device)
        return self._draft_probs

    # -- the step a bucket replays ----------------------------------------------------------------
    def step_fn(self, size: int, kind: str, query_len: int = 1
                ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """The eager Python function of one padded step over the first ``size`` rows of the static
        buffers. Decode (query_len 1): returns (tokens int64 [size], fp32 logits [size, vocab]).
        Verify (query_len k + 1, a VERIFY_KINDS kind): every row holds its last known token then its
        k drafts; returns (the emitted run of each row int64 [size, k + 1], -1 after it ends; fp32
        logits [size * (k + 1), vocab]): which drafts pass is decided on the device, in the step.
        "greedy" at query_len q > 1: returns (the argmax of every token row int64 [size * q], fp32
        logits [size * q, vocab]).
        Compiling or capturing it is what ``run`` does; calling it directly runs the same math eagerly
        (a notebook can)."""
        if query_len == 1 and kind not in SAMPLER_KINDS \
                or query_len > 1 and kind not in (*VERIFY_KINDS, "greedy"):
            raise ValueError(f"sampler kind {kind!r} does not fit query_len={query_len}: decode takes "
                             f"{SAMPLER_KINDS}, query_len > 1 takes {VERIFY_KINDS} or 'greedy'")
        r = self.runner
        meta = r.static_meta(size, query_len)
        model, backend, caches = r.model, r.backend, r.kv_caches
        input_ids = r.input_ids[:size * query_len]
        params = (r.temperatures[:size], r.top_k[:size], r.top_p[:size], r.seeds[:size],
                  r.sample_positions[:size])
        on_gpu = r.device.type == "cuda" and HAS_TRITON
        if kind in VERIFY_KINDS:
            k = query_len - 1
            cu = self._verify_cu.setdefault(
                (size, k), torch.arange(1, size + 1, device=r.device, dtype=torch.int64) * k)
            probs = self.draft_probs_buffer()[:size * k] if kind == "verify" else None
            rejection = rejection_sample if on_gpu else rejection_sample_ref

            def verify_step():
                backend.plan_static(meta)
                hidden = model(input_ids, meta, caches, backend)
                logits = model.compute_logits(hidden)
                # Read inside the step: a reshape of the strided view outside it would be a copy
                # frozen at definition time.
                drafts = input_ids.view(size, query_len)[:, 1:].reshape(-1)
                return rejection(drafts, cu, probs, logits, *params, uniform_k=k), logits

            return verify_step
        sampler = sample if on_gpu else sample_ref
        apply_filters = kind == "filter"
        greedy = kind == "greedy"

        def decode_step():
            backend.plan_static(meta)
            hidden = model(input_ids, meta, caches, backend)
            logits = model.compute_logits(hidden)
            if greedy:
                return logits.argmax(dim=-1), logits
            return sampler(logits, *params, apply_filters=apply_filters), logits

        return decode_step

    def run(self, size: int, kind: str, query_len: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay bucket ``size``'s step (compiling or capturing it on first use). The runner has already
        written every row [0, size) of the static buffers. Outputs are valid until the next replay."""
        key = (size, kind, query_len)
        if self.mode == "compile":
            step = self._steps.get(key)
            if step is None:
                name = f"decode_step_b{size}_{kind}" if query_len == 1 else \
                    f"{'verify' if kind in VERIFY_KINDS else 'extend'}_step_b{size}_q{query_len}_{kind}"
                fn = _own_code(self.step_fn(size, kind, query_len), name)
                step = self._steps[key] = torch.compile(fn, dynamic=False, fullgraph=True,
                                                         options=COMPILE_OPTIONS)
                self.num_compiled += 1
            return step()
        self.runner.backend.prepare_replay(self.runner.static_meta(size, query_len), size)
        if key not in self._graphs:  # a kind first seen now: capture over this step's own rows
            self.capture([size], kind, fill_padding=False, query_len=query_len)
        graph, outputs = self._graphs[key]
        graph.replay()
        return outputs

    # -- CUDA graphs ------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self, sizes: Sequence[int] | None = None, kind: str = "greedy",
                fill_padding: bool = True, query_len: int = 1) -> None:
        """Capture the steps of ``sizes`` (default: every bucket), largest first so the smaller graphs
        reuse the largest one's memory from the shared pool. Each is warmed up eagerly on a side stream
        first (lazy initialisation, autotuning and allocator growth happen outside the capture).
        ``fill_padding``: make every row a padding row first, so the warm-up writes the KV cache's null
        block only (at start-up). False keeps the rows the runner wrote for the step about to replay
        (a lazy capture mid-run): the warm-up then writes the same K/V the replay writes, at the same
        slots, and the buffers still hold the step's inputs."""
        if self.mode != "cuda":
            raise ValueError("capture() is for graph_mode='cuda'; compile mode compiles lazily in run()")
        r = self.runner
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        for size in sorted(sizes or self.sizes, reverse=True):
            if (size, kind, query_len) in self._graphs:
                continue
            if fill_padding:  # a valid all-padding batch: every row writes slot -1
                r.write_padding_rows(0, size, query_len)
            r.backend.prepare_replay(r.static_meta(size, query_len), size)
            step = self.step_fn(size, kind, query_len)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = step()
            self._graphs[(size, kind, query_len)] = (graph, outputs)
            self.num_compiled += 1
        torch.cuda.synchronize()

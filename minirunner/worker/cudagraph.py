"""The graph manager: one compiled (CPU) or captured (CUDA) step per key, over the bucket ladder.

Owns which uniform batches run as one replay (``bucket``, the one rule, capped by the token buffers), the
step functions over the static buffers (worker/buffers.py) — the decode step, and the uniform verify step
of speculative decoding: every request at k + 1 query tokens, the rejection sampler inside the graph —
keyed by a ``GraphKey`` (bucket size, ``GraphKind``, query length), their compilation
(``torch.compile(dynamic=False)``, per key on first use) or capture (``torch.cuda.CUDAGraph``: every key
at start-up, largest bucket first, after a warm-up on a side stream, one shared memory pool), and replay.
It is handed the buffers, the model, the backend and the KV caches, and holds no reference to the
runner. A step reads everything from the buffers and writes nothing but the KV cache and its outputs: it
must never sync with the host, allocate outside the step's own pool, or read a buffer row that was not
written for this step (buffers.py writes every row of the bucket, padding rows included). Prefill, mixed
steps, verify steps of unequal k and batches above the largest bucket take no bucket (the runner decides):
``eager_forward`` runs them, piecewise-compiled under "compile" (worker/compiled_forward.py), else eager.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from minirunner.kernels._triton import use_triton
from minirunner.kernels.sampling import sample, sample_ref
from minirunner.spec_decode.rejection_sampler import RejectionSampler
from minirunner.worker.compile_cache import COMPILE_OPTIONS, configure_compile_cache
from minirunner.worker.compiled_forward import CompiledForward, own_code, unguarded
from minirunner.worker.graph_keys import (  # noqa: F401 (capture_sizes: imported from here too)
    bucket_for,
    capture_sizes,
    context_columns,
    narrow_context,
)
from minirunner.worker.runner_output import StepGraphInfo


class GraphKind(enum.Enum):
    """The sampler a graph step ends with. Decode (query length 1): GREEDY is one argmax; SAMPLE the
    seeded Gumbel sampler (greedy rows keep their argmax); FILTER adds the top-k / top-p sort (static-shape
    device code too, a separate kind only because greedy and plain temperature batches should not pay a
    full-vocabulary sort). Verify (query length k + 1): the rejection sampler over every request's k + 1
    rows, with the draft model's q read from a buffer (VERIFY) or one-hot drafts (VERIFY_ONEHOT, n-gram).
    GREEDY also runs at query length q > 1: every token row's argmax and logits (the draft model's first
    pass after a graph step, its query and the token it sampled, spec_decode/draft_passes.py)."""

    GREEDY = "greedy"
    SAMPLE = "sample"
    FILTER = "filter"
    VERIFY = "verify"
    VERIFY_ONEHOT = "verify_onehot"


SAMPLER_KINDS = (GraphKind.GREEDY, GraphKind.SAMPLE, GraphKind.FILTER)
VERIFY_KINDS = (GraphKind.VERIFY, GraphKind.VERIFY_ONEHOT)


@dataclass(frozen=True, slots=True)
class GraphKey:
    """One compiled or captured step: ``size`` rows of ``query_len`` tokens each, ending with ``kind``."""

    size: int
    kind: GraphKind
    query_len: int = 1

    def __post_init__(self):
        if self.query_len == 1 and self.kind not in SAMPLER_KINDS \
                or self.query_len > 1 and self.kind not in (*VERIFY_KINDS, GraphKind.GREEDY):
            raise ValueError(f"graph kind {self.kind} does not fit query_len={self.query_len}: decode "
                             "takes GREEDY, SAMPLE or FILTER; query_len > 1 takes VERIFY, VERIFY_ONEHOT "
                             "or GREEDY")

    @property
    def name(self) -> str:
        if self.query_len == 1:
            return f"decode_step_b{self.size}_{self.kind.value}"
        what = "verify" if self.kind in VERIFY_KINDS else "extend"
        return f"{what}_step_b{self.size}_q{self.query_len}_{self.kind.value}"


class CudaGraphManager:
    """One step per GraphKey, compiled or captured, replayed by ``run``.

    ``buffers``: the StepBuffers every step reads; ``model``, ``backend``, ``kv_caches``: what it runs;
    ``mode``: "compile" or "cuda"; ``max_draft_tokens``: the largest k a verify step may carry (0: no
    speculative decoding), which sizes the buffer of the draft model's q ([largest bucket * k, vocab]
    fp32, made on first use; ``draft_q``: whether VERIFY steps, which read it, will run, as opposed to
    VERIFY_ONEHOT only). ``extra_query_lens``: further GREEDY query lengths a run replays (the draft's
    first pass). ``rejection_sampler``: what a verify step ends with (the runner's; None: a new one).
    """

    def __init__(self, buffers, model, backend, kv_caches, mode: str, sizes: Sequence[int],
                 max_draft_tokens: int = 0, draft_q: bool = False, extra_query_lens: Sequence[int] = (),
                 rejection_sampler: RejectionSampler | None = None):
        if mode not in ("compile", "cuda"):
            raise ValueError(f"CudaGraphManager runs graph_mode 'compile' or 'cuda', not {mode!r}")
        if not backend.supports_graphs:
            raise ValueError(f"attention_backend={backend.name!r} has no capturable plan; use "
                             "graph_mode='none'")
        if mode == "compile" and backend.name != "torch":
            raise ValueError(f"graph_mode='compile' traces the step with torch.compile, which needs "
                             f"attention_backend='torch' (got {backend.name!r}); use graph_mode='cuda' "
                             "for the triton/flashinfer kernels on a GPU")
        self.buffers, self.model, self.backend, self.kv_caches = buffers, model, backend, kv_caches
        self.mode, self.device = mode, buffers.device
        self.rejection_sampler = rejection_sampler or RejectionSampler(self.device)
        # vLLM caps cudagraph_capture_sizes by max_num_batched_tokens: a bucket's rows are token rows of
        # the static buffers, so a bucket larger than the token budget could never be written.
        self.max_tokens = buffers.max_num_tokens
        self.sizes = [s for s in sizes if s <= self.max_tokens]
        self.max_draft_tokens = max_draft_tokens
        self.extra_query_lens = tuple(extra_query_lens)
        # compile: one step per (key, block-table columns: its rung of the context ladder, graph_keys.py;
        # the full width only for a decode step through the C kernel, ``_columns``)
        self._steps: dict[tuple[GraphKey, int], Callable[[], tuple[torch.Tensor, torch.Tensor]]] = {}
        self.cache_dir = configure_compile_cache() if mode == "compile" else None
        # what runs the steps no bucket takes (the module docstring says how)
        self.eager_forward = CompiledForward(model) if mode == "compile" else model
        self._graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self._verify_cu: dict[tuple[int, int], torch.Tensor] = {}
        self.draft_q = draft_q
        self._draft_probs: torch.Tensor | None = None
        self._pool = None
        if hasattr(backend, "split_decode_by_length"):
            backend.split_decode_by_length = False  # one static decode group, whatever the lengths
        if mode == "compile":  # compiled decode attends through the C kernel where it builds
            backend.use_cpu_kernel(self.cache_dir / "kernels")

    def eager_step_info(self, num_tokens: int, reason: str = "") -> StepGraphInfo:
        """How a step no bucket took (``reason``) ran: "piecewise" through the compiled forward, else
        "eager"."""
        piecewise = self.mode == "compile" and self.eager_forward.takes(num_tokens)
        return StepGraphInfo("piecewise" if piecewise else "eager", reason=reason)

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
        if not (1 <= k <= self.max_draft_tokens) or not self.backend.supports_verify_graphs:
            return None
        return self.bucket(batch_size, k + 1)

    def keys(self) -> list[GraphKey]:
        """Every key compiled or captured so far (a compiled key once, whatever its context rungs)."""
        return list(dict.fromkeys(key for key, _ in self._steps)) + list(self._graphs)

    def contexts(self) -> list[tuple[GraphKey, int]]:
        """(key, block-table columns) of every compiled step so far: the context rungs each key used."""
        return list(self._steps)

    def cuda_graph(self, key: GraphKey) -> torch.cuda.CUDAGraph:
        """The captured graph of ``key`` (graph_mode='cuda'), e.g. to replay it under a sync check."""
        return self._graphs[key][0]

    def startup_keys(self) -> list[GraphKey]:
        """Every key a run may replay: each bucket's decode kinds, the verify kinds for k = 1 ..
        max_draft_tokens, and GREEDY at the extra query lengths (where the bucket fits the buffers)."""
        keys = [GraphKey(s, kind) for s in self.sizes for kind in SAMPLER_KINDS]
        if self.backend.supports_verify_graphs:
            keys += [GraphKey(s, kind, k + 1) for k in range(1, self.max_draft_tokens + 1)
                     for s in self.sizes if self.bucket(s, k + 1) == s for kind in VERIFY_KINDS
                     if kind is GraphKind.VERIFY_ONEHOT or self.draft_q]
            keys += [GraphKey(s, GraphKind.GREEDY, q) for q in self.extra_query_lens
                     for s in self.sizes if self.bucket(s, q) == s]
        return keys

    def _probs_buffer(self) -> torch.Tensor:
        """The [largest bucket * max_draft_tokens, vocab] fp32 buffer a VERIFY step reads q from."""
        if self._draft_probs is None:
            self._draft_probs = torch.zeros(max(self.sizes, default=0) * self.max_draft_tokens,
                                            self.model.config.vocab_size, dtype=torch.float32,
                                            device=self.device)
        return self._draft_probs

    def write_draft_probs(self, probs: torch.Tensor) -> None:
        """The draft's q of a VERIFY step: rows request after request, k per request (the step reads
        its own n * k rows only; zeros where nothing was written read as q = 0, never accepted)."""
        self._probs_buffer()[:probs.shape[0]].copy_(probs)

    # -- the step a key replays -------------------------------------------------------------------
    def step_fn(self, key: GraphKey, columns: int | None = None
                ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """The eager Python function of one padded step over the first ``key.size`` rows of the buffers.
        Decode (query_len 1): returns (tokens int64 [size], fp32 logits [size, vocab]). Verify (query_len
        k + 1): every row holds its last known token then its k drafts; returns (the emitted run of each
        row int64 [size, k + 1], -1 after it ends; fp32 logits [size * (k + 1), vocab]): which drafts pass
        is decided on the device, in the step. GREEDY at query_len q > 1: (the argmax of every token row
        int64 [size * q], fp32 logits [size * q, vocab]). Compiling or capturing it is what ``run`` does;
        calling it directly runs the same math eagerly (a notebook can). ``columns``: attend over the
        first this many block-table columns only (None: the full width)."""
        size, kind, query_len = key.size, key.kind, key.query_len
        b = self.buffers
        meta = b.static_meta(size, query_len)
        meta = meta if columns is None else narrow_context(meta, columns)
        model, backend, caches = self.model, self.backend, self.kv_caches
        input_ids = b.input_ids[:size * query_len]
        params = b.sampling_params(size)
        on_gpu = use_triton(self.device)
        if kind in VERIFY_KINDS:
            k = query_len - 1
            cu = self._verify_cu.setdefault(
                (size, k), torch.arange(1, size + 1, device=self.device, dtype=torch.int64) * k)
            probs = self._probs_buffer()[:size * k] if kind is GraphKind.VERIFY else None
            rejection = self.rejection_sampler

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
        apply_filters = kind is GraphKind.FILTER
        greedy = kind is GraphKind.GREEDY

        def decode_step():
            backend.plan_static(meta)
            hidden = model(input_ids, meta, caches, backend)
            logits = model.compute_logits(hidden)
            if greedy:
                return logits.argmax(dim=-1), logits
            return sampler(logits, *params, apply_filters=apply_filters), logits

        return decode_step

    def run(self, key: GraphKey, max_seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay ``key``'s step (compiled on first use, per context rung of ``max_seq_len``, the batch's
        longest sequence, where the step's attention needs one (``_columns``); captured at start-up).
        Every row [0, size) of the buffers is already written. Outputs are valid until the next replay."""
        if self.mode == "compile":
            columns = self._columns(key, max_seq_len)
            step = self._steps.get((key, columns))
            if step is None:  # compile (or load) and check it once; replays skip the checks
                fn = own_code(self.step_fn(key, columns), f"{key.name}_c{columns}")
                compiled = torch.compile(fn, dynamic=False, fullgraph=True, options=COMPILE_OPTIONS)
                outputs = compiled()
                self._steps[(key, columns)] = unguarded(fn, compiled)
                return outputs
            return step()
        self.backend.prepare_replay(self.buffers.static_meta(key.size, key.query_len), key.size)
        if key not in self._graphs:
            raise ValueError(f"{key} was not captured at start-up: capture_all() captures every key a "
                             "run may replay (startup_keys)")
        graph, outputs = self._graphs[key]
        graph.replay()
        return outputs

    def _columns(self, key: GraphKey, max_seq_len: int | None) -> int:
        """The block-table columns ``key``'s compiled step attends over at ``max_seq_len``: its context
        rung; the full width for a decode step that attends through the C kernel, which reads each row up
        to its own length whatever the width (one compile per key, not one per rung)."""
        if key.query_len == 1 and self.backend.cpu_kernel:
            max_seq_len = None
        return context_columns(max_seq_len, self.buffers.block_size, self.buffers.max_blocks_per_seq)

    # -- CUDA graphs ------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every start-up key, largest bucket first so the smaller graphs reuse the largest one's
        memory from the shared pool. Each is warmed up eagerly on a side stream first (lazy
        initialisation, autotuning and allocator growth happen outside the capture), over all-padding
        rows, so the warm-up and the capture write the KV cache's null block only."""
        if self.mode != "cuda":
            raise ValueError("capture_all() is for graph_mode='cuda'; compile mode compiles on first use")
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        for key in sorted(self.startup_keys(), key=lambda k: (-k.size, k.query_len, k.kind.value)):
            if key in self._graphs:
                continue
            self.buffers.write_padding_rows(0, key.size, key.query_len)
            self.backend.prepare_replay(self.buffers.static_meta(key.size, key.query_len), key.size)
            step = self.step_fn(key)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = step()
            self._graphs[key] = (graph, outputs)
        torch.cuda.synchronize()

"""ModelRunner: turns one scheduled step (data, core/sched/output.py) into tensors, runs the model over
the paged KV cache, samples.

One step applies what its data says first (finished and preempted requests forgotten, block copies),
then ``update_states`` (the worker's own rows) and four stages, each a method a notebook can call:
``prepare_inputs → run_model → compute_logits → sample``; ``execute`` launches them (or one graph replay,
the sampler's per-row work after it) and returns an AsyncOutput (worker/async_output.py), whose
``get_output`` gives its RunnerOutput (worker/runner_output.py) — nothing is kept on the runner.

Owns the KV cache tensors (one block more than the pool hands out: the null block, where padding rows,
slot -1, may write), the persistent per-request state rows (worker/states.py), the step buffers
(worker/buffers.py, the only writer), the sampler (worker/sampler.py) and the graph manager
(worker/cudagraph.py), the choice between a graph replay and an eager step, and the input path, chosen
at construction (``set_input_prep``): GPU-native (the state rows' device mirrors, worker/state_mirror.py,
read by the input-prep kernel; the CUDA default) or host (numpy; the CPU default). Input preparation is
worker/input_batch.py. It never decides what to schedule and never appends a token to a request.
"""

from __future__ import annotations

import numpy as np
import torch

from minirunner.attention.base import AttentionBackend
from minirunner.core.host_copy import to_device
from minirunner.core.sched.output import SchedulerOutput
from minirunner.kernels._triton import use_triton
from minirunner.kv.block_table import cdiv
from minirunner.logprobs import score_prompts
from minirunner.model.decoder import DecoderLM
from minirunner.spec_decode.proposer import Proposer
from minirunner.worker.async_output import AsyncOutput, DeviceDrafts, PrevSampled, StepTimer
from minirunner.worker.buffers import StepBuffers
from minirunner.worker.cudagraph import CudaGraphManager, GraphKey, GraphKind
from minirunner.worker.drafter import EAGER_STEP, Drafter, LaunchedStep
from minirunner.worker.input_batch import InputBatch, graph_rows, prepare_input_batch
from minirunner.worker.runner_output import RunnerOutput, StepGraphInfo
from minirunner.worker.sampler import Sampler
from minirunner.worker.state_mirror import StateMirror
from minirunner.worker.states import RequestStateRows


def allocate_kv_caches(cfg, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> list[torch.Tensor]:
    """One [num_blocks + 1, 2, block_size, num_kv_heads, head_dim] tensor per layer: K is [:, 0], V is
    [:, 1], and the extra block is the null block that padding rows (slot -1) may write."""
    shape = (num_blocks + 1, 2, block_size, cfg.num_kv_heads, cfg.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]


class ModelRunner:
    def __init__(self, model: DecoderLM, backend: AttentionBackend, num_blocks: int,
                 block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, input_prep: str | None = None):
        """``input_prep``: "device" (GPU-native input preparation) or "host"; None: "device" on CUDA with
        Triton, else "host"."""
        cfg = model.config
        self.model, self.backend = model, backend
        self.device, self.dtype = backend.device, backend.dtype
        self.block_size = block_size
        self.kv_caches = allocate_kv_caches(cfg, num_blocks, block_size, self.dtype, self.device)
        self.max_blocks_per_seq = cdiv(max_model_len, block_size)
        self.state = RequestStateRows(2 * max_num_seqs, self.max_blocks_per_seq)
        self.buffers = StepBuffers(self.device, max_num_batched_tokens, max_num_seqs,
                                   self.max_blocks_per_seq, block_size)
        self.graphs: CudaGraphManager | None = None
        self.sampler = Sampler(self.state, cfg.vocab_size, self.device)
        self.input_prep, self.state_mirror = "host", None
        self.set_input_prep(input_prep)
        self.drafter: Drafter | None = None

    def set_proposer(self, proposer: Proposer) -> None:
        """Propose drafts after sampling with ``proposer`` (n-gram, or a draft model: it shares this
        runner's block tables, rows and step buffers)."""
        self.drafter = Drafter(proposer, self.state, self.device, self.buffers)

    def enable_graphs(self, mode: str, sizes: list[int], max_draft_tokens: int = 0, draft_q: bool = False,
                      extra_query_lens: tuple[int, ...] = ()) -> CudaGraphManager:
        """Run uniform batches that fit a bucket of ``sizes`` as one compiled ("compile") or captured
        ("cuda") step; under "cuda" every key a run may replay is captured now, largest bucket first.
        ``max_draft_tokens`` > 0: uniform verify steps with up to that many drafts per request run as
        buckets too (``draft_q``: with a draft model's q; else one-hot drafts only)."""
        self.graphs = CudaGraphManager(self.buffers, self.model, self.backend, self.kv_caches, mode, sizes,
                                   max_draft_tokens, draft_q, extra_query_lens,
                                   self.sampler.rejection_sampler)
        if mode == "cuda":
            self.graphs.capture_all()
        return self.graphs

    def set_input_prep(self, input_prep: str | None) -> None:
        """Choose the input path: "device" (GPU-native: the state rows' device mirrors, uploaded whole
        now and then kept up to date by staged writes, read by the input-prep kernel), "host" (numpy),
        or None ("device" on CUDA with Triton, else "host"). Both fill identical buffers; call it
        between steps (the constructor does)."""
        if input_prep is None:
            input_prep = "device" if use_triton(self.device) else "host"
        if input_prep not in ("device", "host"):
            raise ValueError(f"input_prep must be 'device' (GPU-native) or 'host', got {input_prep!r}")
        self.input_prep = input_prep
        self.state_mirror = StateMirror(self.state, self.device) if input_prep == "device" else None
        if self.state_mirror is None:
            self.state.record_writes(False)

    @torch.inference_mode()
    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Copy whole KV blocks src[i] -> dst[i] in every layer's cache (copy-on-write of a shared
        block before its first write). src, dst: block ids, equal lengths."""
        if not src:
            return
        s, d = to_device(np.asarray([src, dst], dtype=np.int64), self.device)  # staged, pinned
        for cache in self.kv_caches + ([] if self.drafter is None else self.drafter.kv_caches):
            cache[d] = cache[s]

    def _apply_before_step(self, sched: SchedulerOutput) -> None:
        """Forget finished and preempted requests' rows and drafts (a preempted one keeps its logits
        processors), then copy KV blocks (copy-on-write): what the step's data says comes first."""
        for rid in sched.finished_req_ids:
            self.sampler.logits_processors.release(rid)
        for rid in (*sched.finished_req_ids, *sched.preempted_req_ids):
            self.state.release(rid)
            if self.drafter is not None:
                self.drafter.free(rid)
        if sched.block_copies:
            self.copy_blocks([c[0] for c in sched.block_copies], [c[1] for c in sched.block_copies])

    def close(self) -> None:
        """Release what lives outside this process (a tensor-parallel runner stops its workers)."""

    # -- the four stages ------------------------------------------------------------------------
    def update_states(self, sched: SchedulerOutput) -> None:
        """Copy a step's data into the worker's own rows (worker/states.py): new requests, new block
        ids. ``execute`` does it first; a caller preparing inputs itself calls it before."""
        self.state.update(sched)

    def prepare_inputs(self, sched: SchedulerOutput, bucket: int | None = None, query_len: int = 1,
                       prev: PrevSampled | None = None) -> InputBatch:
        """Fill the step buffers from the scheduler's data (worker/input_batch.py); ``bucket``: pad
        a uniform batch of ``query_len`` tokens per request to this many rows for a graph step; ``prev``:
        the tokens of the step still in flight (async scheduling)."""
        return prepare_input_batch(self.state, self.buffers, sched, bucket, query_len,
                                   self.state_mirror, prev)

    def graph_bucket(self, sched: SchedulerOutput) -> tuple[int, int] | str:
        """(bucket, query_len) of the step this batch replays, or why it runs eager (for the trace).
        Decode (query_len 1): every request samples one token. Verify (query_len k + 1): every request
        scores its last known token and up to k drafts; one with fewer is padded inside its row (n-gram
        drafts only). The batch must fit a bucket. Sampling options never decide
        it: the sampler's per-row work runs after the forward (:meth:`Sampler.resample_processed`)."""
        num = sched.num_scheduled_tokens
        if self.graphs is None or not num:
            return "no graphs"
        d = [len(sched.scheduled_spec_decode_tokens.get(rid, ())) for rid in num]
        if len(sched.sampling_req_ids) != len(num) or [n - 1 for n in num.values()] != d:
            return "prefill"
        k = max(d)
        if k and (min(d) < k or sched.grammar_bitmask) and (self.drafter.has_q or max(
                sched.num_computed_tokens().values()) + k + 1 > self.max_blocks_per_seq * self.block_size):
            return "ragged drafts"  # a draft model's q is verified in the replay only, whole and unmasked
        size = self.graphs.bucket(len(num)) if k == 0 else self.graphs.verify_bucket(len(num), k)
        return "no bucket" if size is None else (size, k + 1)

    def run_model(self, inputs: InputBatch) -> torch.Tensor:
        """The forward pass: every layer writes its K/V by slot and attends. Returns hidden states
        [num_tokens, hidden_size]."""
        self.backend.plan(inputs.meta)
        forward = self.model if self.graphs is None else self.graphs.eager_forward
        return forward(inputs.input_ids, inputs.meta, self.kv_caches, self.backend)

    def compute_logits(self, hidden: torch.Tensor, inputs: InputBatch) -> torch.Tensor:
        """fp32 logits [num_sampling, vocab] for the rows that sample only."""
        # every row samples: the indices (ascending, distinct, < num_tokens) are 0..n-1
        every = inputs.logits_indices.shape[0] == hidden.shape[0]
        return self.logits_at(hidden, None if every else inputs.logits_indices)

    def logits_at(self, hidden: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """fp32 logits of the rows ``rows`` (int64, on the device; None: every row) of ``hidden``: the
        one place an eager step computes logits (the sampled rows, and prompt logprobs' rows)."""
        return self.model.compute_logits(hidden if rows is None else hidden[rows])

    def sample(self, logits: torch.Tensor, inputs: InputBatch) -> torch.Tensor:
        """One token per sampling request: int64 [num_sampling] (worker/sampler.py)."""
        return self.sampler.sample(logits, inputs.sample_rows, inputs.sample_states,
                                   inputs.sample_positions)

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput, prev: PrevSampled | None = None) -> AsyncOutput:
        """Launch one step: bring the rows up to date, prepare inputs, run the model (or replay a bucket),
        sample; then, when the step asks for drafts (``num_spec_tokens``), propose them from what was
        sampled (:class:`Drafter`; the step's output is read for it). Returns as soon as the step is
        queued: ``get_output()`` of the result is the step's RunnerOutput (nothing is kept on the
        runner). prev: the sampled tokens of the step still in flight, which this step's requests feed
        (async scheduling), or None."""
        result, step = self._launch(scheduler_output, prev)
        if self.drafter is not None:
            self.drafter.propose(scheduler_output, result, step)
        return result

    def _launch(self, sched: SchedulerOutput, prev: PrevSampled | None
                ) -> tuple[AsyncOutput, LaunchedStep]:
        """Queue the step; returns its output and what the drafter proposes from."""
        timer = StepTimer(self.device)
        self._apply_before_step(sched)
        self.update_states(sched)
        if prev is not None and prev.drafts is not None and sched.in_flight_req_ids:
            return self._launch_ahead(sched, prev.drafts, timer)
        graph = self.graph_bucket(sched)
        bucket, query_len = graph if not isinstance(graph, str) else (None, 1)
        inputs = self.prepare_inputs(sched, bucket, query_len, prev)
        out = RunnerOutput(req_ids=[r.req_id for r in inputs.sample_states],
                           num_drafts=inputs.num_drafts.tolist())
        # the draft model's q of every draft token in order (None: no drafts, or one-hot drafts)
        draft_probs = self.drafter.draft_probs(sched) if self.drafter is not None else None
        n, sampler = len(inputs.sample_rows), self.sampler
        if bucket is not None and query_len > 1:
            runs, out.logits, out.graph = self._replay_verify(bucket, query_len, inputs, draft_probs)
            runs = runs.clone()
            sampler.verify_short_rows(runs, out.logits, query_len - 1, inputs)
            first = np.arange(n) * query_len
            sampler.resample_processed(runs, out.logits, first, inputs)
            return AsyncOutput(out, runs, self._logprobs(out.logits, inputs, first), timer), \
                LaunchedStep(bucket, query_len, runs)
        if bucket is not None:
            tokens, out.logits, out.graph = self._replay(bucket, sampler.graph_kind(inputs.sample_rows), n,
                                                         inputs.meta.max_seq_len)
            tokens = tokens.clone()
            sampler.resample_processed(tokens, out.logits, np.arange(n), inputs)
            return AsyncOutput(out, tokens, self._logprobs(out.logits, inputs), timer), \
                LaunchedStep(bucket, 1, tokens)
        hidden = self.run_model(inputs)
        out.graph = self.graphs.eager_step_info(len(inputs.input_ids), graph) if self.graphs is not None \
            else StepGraphInfo(reason=graph)
        out.prompt_logprobs = score_prompts(self.logits_at, hidden, self.state.prompt_spans(sched))
        if not n:
            return AsyncOutput(out, timer=timer), EAGER_STEP
        out.logits = self.compute_logits(hidden, inputs)
        if len(inputs.draft_token_ids):
            runs = sampler.verify(out.logits, inputs.sample_rows, inputs.draft_token_ids,
                                  inputs.num_drafts, inputs.sample_positions, draft_probs)
            first = np.cumsum(inputs.num_drafts + 1) - inputs.num_drafts - 1
            sampler.resample_processed(runs, out.logits, first, inputs)
            return AsyncOutput(out, runs, self._logprobs(out.logits, inputs, first), timer), EAGER_STEP
        tokens = self.sample(out.logits, inputs)
        return AsyncOutput(out, tokens, self._logprobs(out.logits, inputs), timer), EAGER_STEP

    def _launch_ahead(self, sched: SchedulerOutput, drafts: DeviceDrafts, timer: StepTimer
                      ) -> tuple[AsyncOutput, LaunchedStep]:
        """A verify step launched before the step that proposed its drafts was read: every request feeds
        its last verified token and the k drafts from the device row (``drafts``, same requests in the
        same order), at positions kept on the device. The host's data gives the block tables, the
        sampling parameters and an upper bound on each request's length (its context rung)."""
        rids, k, n = list(sched.num_scheduled_tokens), drafts.k, len(drafts.req_ids)
        if rids != drafts.req_ids or any(sched.num_scheduled_tokens[r] != k + 1 for r in rids):
            raise RuntimeError("a step launched ahead must verify the k device drafts of exactly the "
                               "requests that proposed them; this is a bug: please report it")
        state, bucket = self.state, self.graphs.verify_bucket(n, k)
        tables, params = graph_rows(state, np.asarray([state.row_of[r] for r in rids], dtype=np.int64))
        self.buffers.put_graph_rows(tables, params, bucket, own_host=True)
        ids = torch.cat((drafts.last[:, None], drafts.tokens), 1)
        positions = drafts.start[:, None] + torch.arange(k + 1, device=self.device)
        self.buffers.write_uniform(bucket, n, ids, positions, sample_positions=drafts.start + 1)
        if drafts.q is not None:
            self.graphs.write_draft_probs(drafts.q)
        kind = GraphKind.VERIFY if drafts.q is not None else GraphKind.VERIFY_ONEHOT
        computed = sched.num_computed_tokens()
        runs, logits, info = self._replay(bucket, kind, n, max(computed[r] for r in rids) + k + 1, k + 1)
        runs = runs.clone()  # the next replay overwrites the graph's outputs
        out = RunnerOutput(req_ids=rids, num_drafts=[k] * n, logits=logits, graph=info)
        return AsyncOutput(out, runs, timer=timer), LaunchedStep(bucket, k + 1, runs, ahead=True)

    def _logprobs(self, logits: torch.Tensor, inputs: InputBatch, first: np.ndarray | None = None):
        """The sampled tokens' logprobs, computed when the step is read; None when no request asks.
        ``first``: each request's first logits row in a verify step (its run's first token is scored:
        a request that asks for logprobs is given no drafts)."""
        requests = inputs.sample_states
        if all(r.params.logprobs is None for r in requests):
            return None
        if first is None:
            return lambda tokens: self.sampler.logprobs(logits, tokens, requests)
        rows = to_device(first.astype(np.int64), logits.device)
        return lambda runs: self.sampler.logprobs(logits[rows], runs[:, 0], requests)

    def _replay(self, bucket: int, kind: GraphKind, n: int, max_seq_len: int, query_len: int = 1):
        """Replay bucket ``bucket``'s step of ``kind`` for a batch of ``n`` requests whose longest
        sequence holds ``max_seq_len`` tokens (the context rung, worker/graph_keys.py): (its first n rows
        of tokens or runs, the logits of their n * query_len token rows, copied out: the next replay
        overwrites its outputs; how the step ran)."""
        out, logits = self.graphs.run(GraphKey(bucket, kind, query_len), max_seq_len)
        return out[:n], logits[:n * query_len].clone(), StepGraphInfo(self.graphs.mode, bucket, bucket - n)

    def _replay_verify(self, bucket: int, query_len: int, inputs: InputBatch,
                       draft_probs: torch.Tensor | None):
        """A uniform verify step as one replay: the drafts' q goes to the static buffer, the graph runs
        the target over every row's k + 1 tokens and the rejection sampler, and the emitted runs come
        back in the step's one device-to-host copy (as a decode step's tokens do). Returns (runs on the
        device, logits, how the step ran)."""
        n = len(inputs.sample_states)
        if draft_probs is not None:
            self.graphs.write_draft_probs(draft_probs)
        kind = GraphKind.VERIFY if draft_probs is not None else GraphKind.VERIFY_ONEHOT
        return self._replay(bucket, kind, n, inputs.meta.max_seq_len, query_len)

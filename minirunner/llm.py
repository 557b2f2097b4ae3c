"""LLM: the offline API, mirroring vLLM's ``LLM(model=...).generate(prompts, sampling_params)``.

Owns turning user arguments into an EngineConfig, submitting a batch, driving the engine until it is
done, streaming, chat, and serving one caller at a time (a lock). Sizes, counts and seeds are checked
before anything is built (minirunner/limits.py); the profiler is minirunner/profiler.py. Every prompt of
a call is validated before any is run (minirunner/engine/input_processor.py): a bad one raises ValueError
naming its index, and nothing was started, so nothing is lost. vLLM arguments that are not ours are
checked in minirunner/llm_args.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minirunner.assets import default_model_dir
from minirunner.config import EngineConfig, ModelConfig, resolve_device, resolve_dtype
from minirunner.engine.engine import LLMEngine
from minirunner.engine.input_processor import split_prompts, validate_batch
from minirunner.engine.request_queue import check_priorities
from minirunner.generation_config import sampling_defaults
from minirunner.llm_args import (
    check_named_vllm_args,
    check_vllm_kwargs,
    resolve_generation_config,
    resolve_seed,
)
from minirunner.model.loader import check_checkpoint
from minirunner.outputs import RequestOutput, StreamChunk
from minirunner.profiler import StepProfiler
from minirunner.sampling_params import SamplingParams
from minirunner.tokenizer import render_chat

# A prompt: text, token ids, or vLLM's TextPrompt {"prompt": str} / TokensPrompt {"prompt_token_ids": [...]}
Prompt = str | list[int] | dict

class LLM:
    def __init__(self, model: str | Path | None = None, dtype: str | torch.dtype = "auto",
                 device: str | torch.device = "auto", block_size: int = 16,
                 num_kv_blocks: int | None = None, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.9, enable_prefix_caching: bool = False,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, attention_backend: str = "auto",
                 seed: int | None = 0, kv_layout: str = "paged", trace_block_tables: bool = False,
                 num_threads: int | str | None = "auto", graph_mode: str = "auto",
                 enforce_eager: bool = False, cudagraph_capture_sizes: list[int] | None = None,
                 speculative_config: dict | None = None, async_scheduling: bool = False, *,
                 tokenizer: str | Path | None = None, tokenizer_mode: str = "auto",
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1,
                 max_logprobs: int = 20, generation_config: str = "auto",
                 kv_cache_dtype: str = "auto", enable_chunked_prefill: bool | None = None,
                 disable_log_stats: bool = True, swap_space: float | None = None,
                 scheduling_policy: str = "fcfs", batch_invariant: bool = False, **kwargs):
        """``graph_mode``: "auto" (cuda on a CUDA device, none on a CPU), "none" (eager), "cuda" (a CUDA
        graph per decode bucket), "compile" (torch.compile per bucket: the CPU analogue).
        ``enforce_eager=True`` is vLLM's name for graph_mode="none". ``cudagraph_capture_sizes``: the
        bucket ladder (default [1, 2, 4, 8] then multiples of 8 up to max_num_seqs).
        ``async_scheduling=True``: each step is launched before the host reads the previous one's tokens
        (minirunner/engine/in_flight.py); the outputs are those of the synchronous engine.
        The keyword-only arguments are vLLM's, with vLLM's meaning (README: the LLM(...) table);
        ``generation_config``: "auto" takes default sampling parameters from the model's
        generation_config.json, "vllm" ignores it. ``tensor_parallel_size=N`` shards the model over N
        processes (README, "Beyond one device"). ``batch_invariant=True``: a request's tokens and
        logprobs do not depend on what runs beside it (README, "Batch-invariant mode"). Other vLLM
        arguments go to llm_args.py."""
        check_vllm_kwargs(kwargs)
        check_named_vllm_args(trust_remote_code, tensor_parallel_size, kv_cache_dtype,
                              enable_chunked_prefill, swap_space, disable_log_stats)
        if isinstance(max_logprobs, bool) or not isinstance(max_logprobs, int) or max_logprobs < 0:
            raise ValueError(f"max_logprobs must be an integer >= 0, got {max_logprobs!r}")
        if model is None:
            model = default_model_dir()
            if not (Path(model) / "config.json").is_file():
                raise ValueError("the embedded default model is missing from this installation; "
                                 "pass model=<checkpoint directory>")
        device = resolve_device(device)
        if enforce_eager:
            if graph_mode not in ("auto", "none"):
                raise ValueError(f"enforce_eager=True asks for eager steps but graph_mode={graph_mode!r} "
                                 "asks for graphs: pass one of them")
            graph_mode = "none"
        model_config = ModelConfig.from_dir(model)
        check_checkpoint(model, model_config)  # headers only: before any worker starts or layer is built
        engine_seed = resolve_seed(seed)  # the engine's own generator: the caller's are never seeded
        config = EngineConfig(
            model=str(model), dtype=resolve_dtype(dtype, device, model_config.config_dtype),
            device=device, block_size=block_size, num_kv_blocks=num_kv_blocks,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            attention_backend=attention_backend, seed=engine_seed, kv_layout=kv_layout,
            trace_block_tables=trace_block_tables, num_threads=num_threads, graph_mode=graph_mode,
            cudagraph_capture_sizes=cudagraph_capture_sizes,
            speculative_config=speculative_config, async_scheduling=async_scheduling,
            tokenizer=None if tokenizer is None else str(tokenizer), tokenizer_mode=tokenizer_mode,
            max_logprobs=max_logprobs, tensor_parallel_size=tensor_parallel_size,
            scheduling_policy=scheduling_policy, batch_invariant=batch_invariant)
        generation_dir = resolve_generation_config(generation_config, str(model))
        self._default_sampling = {} if generation_dir is None else sampling_defaults(generation_dir)
        self.engine = LLMEngine(config, model_config)
        self._profiler = StepProfiler(device)
        self._lock, self._stream_owner = threading.Lock(), None  # see _one_caller

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (also on del, at exit, at the end of ``with``)."""
        if getattr(self, "engine", None) is not None:  # None: __init__ raised before the engine
            self.engine.runner.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
    __del__ = close

    @property
    def llm_engine(self) -> LLMEngine:
        """vLLM's name for the engine this LLM drives."""
        return self.engine

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (temperature, top_p, top_k,
        min_p, repetition_penalty, max_new_tokens as max_tokens), as vLLM's; SamplingParams() when it
        sets none or LLM(generation_config="vllm")."""
        return SamplingParams(**self._default_sampling)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block that no request holds (blocks in use keep theirs)."""
        self.engine.block_pool.reset_prefix_cache()
        return True

    # -- batch generation -----------------------------------------------------------------------
    def _submit(self, prompts, sampling_params, priority: Sequence[int] | None = None) -> list[str]:
        """Validate every prompt (and priority), then queue them all; returns their request ids in prompt
        order."""
        prompts = split_prompts(prompts)
        priority = check_priorities(priority, len(prompts), self.engine.config.scheduling_policy)
        if not prompts:
            raise ValueError("prompts is empty: give at least one prompt")
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, Sequence):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} "
                                 "prompts: pass one SamplingParams, or one per prompt")
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params] * len(prompts)
        processed = validate_batch(self.engine.process_input, prompts, params_list)
        ids: list[str] = []
        try:
            for p, rank in zip(processed, priority, strict=True):
                ids.append(self.engine.add_request(p, priority=rank))
        except BaseException:
            self.engine.abort_all(ids)
            raise
        return ids

    def _step(self):
        return self._profiler.step(self.engine.step)

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: list[int] | None = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs in prompt order. A prompt is a string, a list of token
        ids, or vLLM's {"prompt": str} / {"prompt_token_ids": [...]}. ``sampling_params`` None: the
        model's defaults (get_default_sampling_params). Raises ValueError, running nothing, when any
        prompt is refused. ``priority``: one integer per prompt, lower served first (needs
        LLM(scheduling_policy="priority") unless all 0). Calls from several threads run one after the
        other (see ``_one_caller``)."""
        with self._one_caller():
            return self._generate(prompts, sampling_params, use_tqdm, priority)

    def _generate(self, prompts, sampling_params, use_tqdm: bool, priority=None) -> list[RequestOutput]:
        ids = self._submit(prompts, sampling_params, priority)
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm)
        done: set[str] = set()
        try:
            while self.engine.has_unfinished_requests():
                # a group can only finish in a step where one of its completions did: check each such
                # group once per step (linear in n, not a walk over all n siblings per token)
                for gid in {r.group_id for r, _ in self._step() if r.is_finished} - done:
                    if self.engine.group_finished(gid):
                        done.add(gid)
                        bar.update(1)
        except BaseException:
            self.engine.abort_all(ids)  # leave the engine clean for the next call
            raise
        finally:
            bar.close()
        return [self.engine.pop_finished(i) for i in ids]

    def stream(self, prompts: Prompt | list[Prompt],
               sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
               priority: list[int] | None = None) -> Iterator[StreamChunk]:
        """Yield each completion's new tokens and text as the engine produces them (one chunk per
        completion per step). Text is held back while it may still become a stop string or is an
        incomplete character, so a completion's chunks concatenate to exactly its final text. A
        completion's last chunk has ``finished=True``; the chunk that finishes a prompt's last
        completion carries the RequestOutput. Prompts are validated as in ``generate``. The stream holds
        the LLM until it is exhausted or closed: other threads' calls wait for it, and a call from the
        thread that holds it suspended raises RuntimeError (its tokens would be lost otherwise)."""
        with self._one_caller():
            self._stream_owner = threading.get_ident()
            try:
                yield from self._stream(prompts, sampling_params, priority)
            finally:
                self._stream_owner = None

    def _stream(self, prompts, sampling_params, priority) -> Iterator[StreamChunk]:
        index = {s: i for i, s in enumerate(self._submit(prompts, sampling_params, priority))}
        engine = self.engine
        try:
            while engine.has_unfinished_requests():
                produced = self._step()
                last = {request.group_id: i for i, (request, _) in enumerate(produced)}
                for i, (request, new_tokens) in enumerate(produced):
                    gid = request.group_id
                    delta = engine.take_text_delta(request)
                    output = None
                    if last[gid] == i and engine.group_finished(gid):
                        output = engine.pop_finished(gid)
                    yield StreamChunk(gid, index[gid], new_tokens, delta, request.is_finished,
                                      request.finish_reason, output, request.index)
        finally:  # a consumer that stops early (or an error) aborts what is left
            left = [rid for rid in index if rid in self.engine.groups]
            if left:
                self.engine.abort_all(left)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """vLLM's LLM.chat: render each conversation with the tokenizer's chat template (the assistant's
        turn opened) and generate from it. The rendered text is tokenised without adding special
        tokens (the template writes them). A tokenizer without a template raises ValueError."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.get_tokenizer()
        with self._one_caller():  # the tokenizer too serves one caller at a time
            prompts = []
            for conversation in conversations:
                text = render_chat(tok, conversation, chat_template, add_generation_prompt,
                                   **(chat_template_kwargs or {}))
                prompts.append({"prompt": text,
                                "prompt_token_ids": self.engine.input_processor.encode(text, False)})
            return self._generate(prompts, sampling_params, use_tqdm)

    @contextmanager
    def _one_caller(self):
        """One call at a time: a second thread's generate / chat / stream waits for the first (each
        returns what it would alone). A call from the thread whose stream() is suspended would wait for
        itself (or drop the stream's tokens), so it raises instead."""
        if self._stream_owner == threading.get_ident():
            raise RuntimeError("a stream() of this LLM is in progress in this thread: exhaust it or call "
                               "its close() before calling generate, chat or stream again (an LLM serves "
                               "one caller at a time)")
        with self._lock:
            yield

    # -- profiling ------------------------------------------------------------------------------
    def start_profile(self, trace_dir: str | Path | None = None) -> None:
        """Start torch.profiler (CPU, and CUDA on a GPU) around the engine steps that follow; each step
        is a "LLMEngine.step" range in the trace. The trace goes to ``trace_dir``, else to
        $VLLM_TORCH_PROFILER_DIR (vLLM's variable), else to a new private temporary folder."""
        self._profiler.start(trace_dir)

    def stop_profile(self) -> Path:
        """Stop the profiler and write its Chrome / Perfetto trace (ui.perfetto.dev); returns its path."""
        return self._profiler.stop()

    # -- introspection --------------------------------------------------------------------------
    def get_step_trace(self) -> list[dict]:
        """One dict per engine step (``minirunner.engine.trace.StepTrace``; the last 10,000 steps)."""
        return [asdict(t) for t in self.engine.trace]

    def get_metrics(self) -> list:
        """vLLM's: Counter / Gauge / Histogram / Vector records (minirunner.metrics), a snapshot."""
        return self.engine.get_metrics()

    def get_spec_metrics(self) -> dict | None:
        """Engine-wide speculative-decoding metrics (``SpecStats.as_dict()``), None without speculation."""
        return None if self.engine.spec is None else self.engine.spec.stats.as_dict()

    def clear_step_trace(self) -> None:
        self.engine.trace.clear()

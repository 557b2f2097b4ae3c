"""LLM: the offline API, mirroring vLLM's ``LLM(model=...).generate(prompts, sampling_params)``.

Owns turning user arguments into an EngineConfig, submitting a batch, driving the engine until it is
done, and streaming. A bad prompt in a batch gets an error output (finish_reason "error") with the
reason, and a warning; every other prompt is still served.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minirunner.assets import default_model_dir
from minirunner.config import EngineConfig, ModelConfig, parse_dtype
from minirunner.engine import LLMEngine
from minirunner.outputs import CompletionOutput, RequestOutput, StreamChunk
from minirunner.sampling_params import SamplingParams

Prompt = str | list[int]


def _resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA device is available; "
                         "use device='cpu'")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device} is not supported; use 'cpu', 'cuda' or 'auto'")
    return device


def _resolve_dtype(dtype: str | torch.dtype, device: torch.device, config_dtype: str | None):
    if dtype != "auto":
        return parse_dtype(dtype)
    if device.type == "cpu":
        return torch.float32  # exact and fast enough for the small models a CPU runs
    return parse_dtype(config_dtype) if config_dtype in ("bfloat16", "float16") else torch.bfloat16


class LLM:
    def __init__(self, model: str | Path | None = None, dtype: str | torch.dtype = "auto",
                 device: str | torch.device = "auto", block_size: int = 16,
                 num_kv_blocks: int | None = None, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.9, enable_prefix_caching: bool = False,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, attention_backend: str = "auto",
                 seed: int = 0, kv_layout: str = "paged", trace_block_tables: bool = False,
                 num_threads: int | str | None = "auto", graph_mode: str = "auto",
                 enforce_eager: bool = False, cudagraph_capture_sizes: list[int] | None = None,
                 speculative_config: dict | None = None, async_scheduling: bool = False):
        """``graph_mode``: "auto" (cuda on a CUDA device, none on a CPU), "none" (eager), "cuda" (a CUDA
        graph per decode bucket), "compile" (torch.compile per bucket: the CPU analogue).
        ``enforce_eager=True`` is vLLM's name for graph_mode="none". ``cudagraph_capture_sizes``: the
        bucket ladder (default [1, 2, 4, 8] then multiples of 8 up to max_num_seqs).
        ``async_scheduling=True`` (with a draft-model ``speculative_config`` and graphs): a steady batch's
        next speculative step is launched before the host reads this one's accepted tokens
        (minirunner/spec/async_loop.py); the tokens are those of the synchronous engine."""
        if model is None:
            model = default_model_dir()
            if not (Path(model) / "config.json").is_file():
                raise ValueError("the embedded default model is missing from this installation; "
                                 "pass model=<checkpoint directory>")
        device = _resolve_device(device)
        if enforce_eager:
            if graph_mode not in ("auto", "none"):
                raise ValueError(f"enforce_eager=True asks for eager steps but graph_mode={graph_mode!r} "
                                 "asks for graphs: pass one of them")
            graph_mode = "none"
        model_config = ModelConfig.from_dir(model)
        config = EngineConfig(
            model=str(model), dtype=_resolve_dtype(dtype, device, model_config.config_dtype),
            device=device, block_size=block_size, num_kv_blocks=num_kv_blocks,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            attention_backend=attention_backend, seed=seed, kv_layout=kv_layout,
            trace_block_tables=trace_block_tables, num_threads=num_threads, graph_mode=graph_mode,
            cudagraph_capture_sizes=cudagraph_capture_sizes,
            speculative_config=speculative_config, async_scheduling=async_scheduling)
        self.engine = LLMEngine(config, model_config)

    def get_tokenizer(self):
        return self.engine.tokenizer

    # -- batch generation -----------------------------------------------------------------------
    def _submit(self, prompts, sampling_params) -> list[str | RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        if isinstance(sampling_params, Sequence):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} "
                                 "prompts")
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        submitted: list[str | RequestOutput] = []
        for i, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
            try:
                submitted.append(self.engine.add_request(prompt, params))
            except ValueError as e:
                warnings.warn(f"prompt {i} was refused: {e}", stacklevel=3)
                submitted.append(_error_output(prompt, str(e)))
        return submitted

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt (a string or a list of token ids); outputs in prompt order."""
        submitted = self._submit(prompts, sampling_params)
        ids = [s for s in submitted if isinstance(s, str)]
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm)
        done: set[str] = set()
        try:
            while self.engine.has_unfinished_requests():
                for request, _ in self.engine.step():
                    gid = request.group_id
                    if gid not in done and self.engine.group_finished(gid):
                        done.add(gid)
                        bar.update(1)
        except BaseException:
            self.engine.abort_all(ids)  # leave the engine clean for the next call
            raise
        finally:
            bar.close()
        return [self.engine.pop_finished(s) if isinstance(s, str) else s for s in submitted]

    def stream(self, prompts: Prompt | list[Prompt],
               sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
               ) -> Iterator[StreamChunk]:
        """Yield each completion's new tokens and text as the engine produces them (one chunk per
        completion per step). Text is held back while it may still become a stop string or is an
        incomplete character, so a completion's chunks concatenate to exactly its final text. A
        completion's last chunk has ``finished=True``; the chunk that finishes a prompt's last
        completion carries the RequestOutput."""
        submitted = self._submit(prompts, sampling_params)
        index = {s: i for i, s in enumerate(submitted) if isinstance(s, str)}
        for i, s in enumerate(submitted):
            if not isinstance(s, str):
                yield StreamChunk(s.request_id, i, [], "", True, "error", s)
        engine = self.engine
        try:
            while engine.has_unfinished_requests():
                produced = engine.step()
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

    # -- introspection --------------------------------------------------------------------------
    def get_step_trace(self) -> list[dict]:
        """One dict per engine step (see ``minirunner.trace.StepTrace``; the last 10,000 steps): plain
        data for plots."""
        return [asdict(t) for t in self.engine.trace]

    def get_spec_metrics(self) -> dict | None:
        """Engine-wide speculative-decoding metrics (``SpecStats.as_dict()``), None without speculation."""
        return None if self.engine.spec is None else self.engine.spec.stats.as_dict()

    def clear_step_trace(self) -> None:
        self.engine.trace.clear()


def _error_output(prompt: Prompt, message: str) -> RequestOutput:
    token_ids = prompt if isinstance(prompt, list) else []
    return RequestOutput(
        request_id="", prompt=prompt if isinstance(prompt, str) else None,
        prompt_token_ids=list(token_ids), outputs=[CompletionOutput(0, "", [], "error")],
        finished=True, error=message)

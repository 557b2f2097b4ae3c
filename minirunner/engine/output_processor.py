"""OutputProcessor: applies a step's RunnerOutput to its requests (vLLM's output processor).

Owns what happens to a request after its step ran (the scheduler rolls back rejected drafts,
``Scheduler.update_from_output``): the emitted tokens are appended
one by one with the stop checks (EOS, stop token ids, stop strings through incremental detokenisation,
max_tokens, max_model_len), the logprobs are collected, and completion 0 of an n > 1 group forks its
siblings once its prompt is computed. Forked siblings are returned for the scheduler to queue; requests
that stopped are returned for the engine to free. It never runs the model and never frees blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minirunner.engine.parallel_sampling import fork_children
from minirunner.engine.request import Request
from minirunner.logprobs import collect_step_logprobs


@dataclass(eq=False)
class AppliedStep:
    """What applying one step did: (request, tokens appended) for every request that sampled; the
    requests that stopped (for the engine to free) and their ids; the siblings each fork made, fork by
    fork (the scheduler queues each group ahead of the waiting requests, in this order)."""

    produced: list[tuple[Request, list[int]]] = field(default_factory=list)
    done: list[Request] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    forked: list[list[Request]] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer, kv):
        self.tokenizer, self.kv = tokenizer, kv
        self._token_text: dict[int, str] = {}

    def apply(self, scheduler_output, runner_output, requests: dict[str, Request]) -> AppliedStep:
        """Apply one launched step once its tokens are read: logprobs, then tokens with stop checks (the
        counts moved on at launch, ``Scheduler.update_after_launch``; the placeholders are taken back
        here). ``requests``: every live request by id (prompt logprobs may belong to a request that did
        not sample). A request that finished or was aborted since the launch gets nothing: what the step
        computed for it is discarded (async scheduling checks stops one step late)."""
        scheduled = scheduler_output.scheduled
        collect_step_logprobs(requests, scheduled, runner_output.prompt_logprobs, runner_output.logprobs,
                              self.decode_token)
        out = AppliedStep()
        for s, run in zip([s for s in scheduled if s.is_sampling], runner_output.runs, strict=True):
            request = s.request
            request.num_output_placeholders -= 1 + len(s.draft_token_ids)
            if not request.is_finished:
                self.append_run(request, run, out)
        return out

    def append_run(self, request: Request, run: list[int], out: AppliedStep) -> None:
        """Append a step's emitted tokens to ``request`` with the stop checks token by token (a stop
        truncates the rest of the run), recording into ``out`` what was appended, whether it stopped,
        and the siblings it forked."""
        appended = []
        for token in run:
            request.append_token(token)
            appended.append(token)
            if request.fork_children:
                out.forked.append(fork_children(request, self.kv))
            if check_stop(request, token):
                out.done.append(request)
                out.finished.append(request.request_id)
                break
        out.produced.append((request, appended))

    def decode_token(self, token_id: int) -> str | None:
        """One token's text (cached), for logprobs' ``decoded_token``; None without a tokenizer."""
        if self.tokenizer is None:
            return None
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text


def check_stop(request: Request, token: int) -> bool:
    """vLLM's rules: before min_tokens only the length limit ends a request; EOS ends it with
    stop_reason None, a stop token id with the id (neither token's text is added unless
    include_stop_str_in_output), a stop string with the string. A request without a detokenizer (the
    server's: ``LLMEngine.detokenize`` False) has its stop strings checked by its caller
    (entrypoints/output_handler.py), which finishes it through ``async_llm.finish_by_stop_string``."""
    params = request.params
    detok = request.detok
    stop_string = None
    if params.stops_on(token, len(request.output_token_ids), request.eos_token_ids):
        if detok is not None and params.include_stop_str_in_output:
            detok.append(token)
        request.finish("stop", None if token in request.eos_token_ids else token)
    else:
        stop_string = detok.append(token) if detok is not None else None
        if stop_string is not None:
            request.finish("stop", stop_string)
        elif request.num_tokens >= request.max_len:
            request.finish("length")
    if request.is_finished and detok is not None:
        detok.finish(stopped_by_string=stop_string is not None)
    return request.is_finished

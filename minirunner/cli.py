"""Command line (also the ``minirunner`` console script):

  python -m minirunner generate [--model DIR] "prompt" ...   continue prompts, print a throughput line
  python -m minirunner bench [--workload nano] [--compare transformers] ...   benchmark a workload
  python -m minirunner serve [--model DIR] [--port 8000] ...   an OpenAI-compatible server
  python -m minirunner bench serve --base-url URL --request-rate R ...   load a running server
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time

from minirunner.core.gc_heap import freeze_startup_heap
from minirunner.llm import LLM
from minirunner.log import LOG_LEVELS, configure_logging
from minirunner.sampling_params import SamplingParams


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}); quote it for the shell, e.g. "
                                         """'{"method": "ngram", "num_speculative_tokens": 3}'""") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("give a JSON object, e.g. '{\"method\": \"ngram\", ...}'")
    return value


def _engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="Hugging Face checkpoint directory (default: the embedded Shakespeare model)")
    p.add_argument("--dtype", default="auto", help="auto = float32 on CPU, the checkpoint's on GPU")
    p.add_argument("--device", default="auto", help="auto = cuda if available, else cpu")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV blocks in the pool (default: from the memory budget)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest sequence (default: the model's max_position_embeddings)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one step")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="most tokens in one step")
    p.add_argument("--enable-prefix-caching", action="store_true", help="share KV of common prefixes")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton", "flashinfer"],
                   help="auto = flashinfer, else triton on CUDA; torch on CPU")
    p.add_argument("--graph-mode", default="auto", choices=["auto", "none", "cuda", "compile"],
                   help="decode steps as graphs: auto = cuda on a GPU, none on a CPU; compile = "
                        "torch.compile per batch bucket")
    p.add_argument("--cudagraph-capture-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="the bucket ladder (default 1 2 4 8 then multiples of 8 up to --max-num-seqs)")
    p.add_argument("--speculative-config", default=None, type=_json_dict, metavar="JSON",
                   help='speculative decoding, vLLM\'s dict as JSON, e.g. \'{"method": "ngram", '
                        '"num_speculative_tokens": 3}\' or \'{"method": "draft_model", '
                        '"num_speculative_tokens": 3}\' (the embedded draft on the embedded model)')
    p.add_argument("--async-scheduling", action="store_true",
                   help="launch each step before the host has read the previous one's tokens "
                        "(vLLM's async scheduling; the outputs are the synchronous engine's)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="a request's tokens and logprobs do not depend on its batch (CPU, float32; "
                        "steps run eager)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="shard the model over N processes (gloo on CPU, NCCL on N GPUs)")
    p.add_argument("--num-threads", default="auto",
                   help="CPU threads for torch: auto = one per core; 1 is faster on a machine "
                        "shared with other busy jobs")
    p.add_argument("--log-level", default="warning", choices=LOG_LEVELS,
                   help="minirunner's messages shown on stderr: warning shows fallbacks from a fast "
                        "path (e.g. the C decode kernel not built); info also shows choices made")


def _llm_kwargs(args) -> dict:
    return dict(model=args.model, dtype=args.dtype, device=args.device, block_size=args.block_size,
                num_kv_blocks=args.num_kv_blocks, max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                enable_prefix_caching=args.enable_prefix_caching, attention_backend=args.attention_backend,
                graph_mode=args.graph_mode, cudagraph_capture_sizes=args.cudagraph_capture_sizes,
                speculative_config=args.speculative_config, async_scheduling=args.async_scheduling,
                tensor_parallel_size=args.tensor_parallel_size, batch_invariant=args.batch_invariant,
                num_threads=args.num_threads if args.num_threads == "auto" else _int(args.num_threads))


def _bounded(low: int, high: int):
    """An argparse type: an integer within [low, high] (argparse reports anything else, exit code 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be within [{low}, {high}], got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def _int(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text  # LLM refuses it with a message saying what is allowed


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="minirunner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", formatter_class=fmt,
                         help="continue one or more prompts (sampled with the model's defaults)",
                         description="Continue prompts with the model. Sampling parameters not given "
                                     "come from the model's generation_config.json (as vLLM's "
                                     "generation_config='auto'), else vLLM's defaults (temperature 1); "
                                     "--temperature 0 is greedy. The seed is printed so a run can be "
                                     "repeated with --seed.")
    gen.add_argument("prompts", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per prompt")
    gen.add_argument("--temperature", type=float, default=None,
                     help="0 = greedy (default: the model's generation config, else 1)")
    gen.add_argument("--top-p", type=float, default=None,
                     help="nucleus sampling mass, 1 = off (default: the model's generation config, else 1)")
    gen.add_argument("--top-k", type=int, default=None,
                     help="sample among the k most likely, -1 = off (default: the model's generation "
                          "config, else off)")
    gen.add_argument("--seed", type=int, default=None,
                     help="makes sampling reproducible (default: a fresh seed, printed)")
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    _engine_options(gen)

    from minirunner.tools.bench import COMPARE, WORKLOADS

    bench = sub.add_parser(
        "bench", formatter_class=fmt, help="benchmark a seeded workload (optionally side by side)",
        description="Run a seeded workload (greedy, EOS ignored) and print throughput, TTFT and time per "
                    "output token (p50/p99), peak concurrent sequences, KV utilisation, preemptions and "
                    "prefix-cache hits. --compare runs transformers generate (on a CPU with one thread and "
                    "with torch's default, keeping the faster) or a contiguous KV layout on the same "
                    "prompts in the same run.")
    bench.add_argument("--workload", default="nano", choices=WORKLOADS,
                       help="nano: uniform lengths (nano-vllm's bench); sharegpt / alpaca: the vLLM "
                            "paper's length means scaled to max_model_len; fixed: --input-len/--output-len")
    bench.add_argument("--num-requests", type=_bounded(1, 100_000), default=64)
    bench.add_argument("--input-len", type=_bounded(1, 1 << 20), nargs=2, default=[8, 96],
                       metavar=("MIN", "MAX"),
                       help="prompt length range (nano) or the fixed length (fixed: MIN)")
    bench.add_argument("--output-len", type=_bounded(1, 1 << 20), nargs=2, default=[16, 160],
                       metavar=("MIN", "MAX"),
                       help="output length range (nano) or the fixed length (fixed: MIN)")
    bench.add_argument("--seed", type=_bounded(0, 2**63 - 1), default=0, help="seeds lengths and token ids")
    bench.add_argument("--compare", action="append", default=[], choices=COMPARE,
                       help="also run this baseline on the same prompts (repeatable)")
    bench.add_argument("--hf-batch-size", type=_bounded(1, 4096), default=16,
                       help="static batch size of the transformers baseline")
    bench.add_argument("--warmup", default="short", choices=["short", "workload"],
                       help="before each timed run: two short requests (short) or the whole workload "
                            "once, untimed (workload: steady state, no first-time costs)")
    bench.add_argument("--kv-cache-memory-bytes", type=_bounded(1, 1 << 62), default=None,
                       help="KV budget in bytes")
    bench.add_argument("--json", default=None, help="write the report as JSON here")
    bench.add_argument("--plot", default=None, help="write throughput / KV utilisation over time (PNG)")
    bench.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _engine_options(bench)
    from minirunner.entrypoints.openai.cli_args import add_serve_parser
    from minirunner.tools.bench.serve_cli import add_bench_serve_parser

    add_bench_serve_parser(bench)  # minirunner bench serve --url ...: load a running server

    add_serve_parser(sub)
    return parser


def _sampling_params(args, llm: LLM) -> SamplingParams:
    """The model's generation-config defaults (``LLM.get_default_sampling_params``), overridden by the flags
    given; a fresh seed when none is given (printed by the caller, so the run can be repeated)."""
    given = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    return dataclasses.replace(llm.get_default_sampling_params(),
                               **{k: v for k, v in given.items() if v is not None},
                               max_tokens=args.max_tokens, seed=seed, stop=args.stop,
                               ignore_eos=args.ignore_eos)


def _generate(args) -> int:
    freeze_startup_heap()  # an entry point: what start-up imported, out of the collector's way
    try:
        llm = LLM(**_llm_kwargs(args))
        params = _sampling_params(args, llm)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        outputs = llm.generate(args.prompts, params, use_tqdm=False)
    except ValueError as e:  # a refused prompt: nothing was generated
        print(f"error: {e}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    for out in outputs:
        print(f"{out.prompt}{out.outputs[0].text}")
        print()
    n_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    n_in = sum(len(o.prompt_token_ids) for o in outputs)
    backend = llm.engine.backend.name
    tp = f", tensor_parallel_size {args.tensor_parallel_size}" if args.tensor_parallel_size > 1 else ""
    how = "greedy" if params.greedy else (f"temperature {params.temperature:g}, top_p {params.top_p:g}"
                                          + (f", top_k {params.top_k}" if params.top_k > 0 else "")
                                          + f", seed {params.seed} (--seed {params.seed} repeats it)")
    print(f"[{len(outputs)} requests, {n_in} prompt + {n_out} generated tokens in "
          f"{elapsed:.2f} s: {n_out / max(elapsed, 1e-9):.1f} tok/s; {how}; device "
          f"{llm.engine.config.device}, {llm.engine.config.dtype}, backend {backend}{tp}]")
    return 0


def _bench(args) -> int:
    from minirunner.tools.bench import format_table, plot_report, run_bench, write_json

    try:
        report = run_bench(workload=args.workload, num_requests=args.num_requests,
                           input_len=tuple(args.input_len), output_len=tuple(args.output_len),
                           seed=args.seed, compare=args.compare, hf_batch_size=args.hf_batch_size,
                           use_tqdm=not args.no_progress, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                           warmup=args.warmup, **_llm_kwargs(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
    if args.plot:
        plot_report(report, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("input_len", "output_len"):
        low, high = getattr(args, flag, None) or (0, 0)
        if low > high:
            parser.error(f"--{flag.replace('_', '-')} MIN MAX: MIN ({low}) must not exceed MAX ({high})")
    for i, prompt in enumerate(getattr(args, "prompts", None) or []):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8 (Python keeps them escaped)
            print(f"error: prompt {i} is not valid UTF-8 text; pass prompts as UTF-8", file=sys.stderr)
            return 2
    configure_logging(getattr(args, "log_level", "warning"))
    if getattr(args, "handler", None) is not None:  # serve (minirunner/entrypoints/openai/cli_args.py)
        return args.handler(args)
    return _generate(args) if args.command == "generate" else _bench(args)


if __name__ == "__main__":
    raise SystemExit(main())

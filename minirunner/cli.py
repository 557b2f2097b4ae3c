"""Command line: ``python -m minirunner generate [--model DIR] "prompt" ...`` (also the ``minirunner``
console script). Prints each continuation, then a one-line throughput summary."""

from __future__ import annotations

import argparse
import sys
import time

from minirunner.llm import LLM
from minirunner.sampling_params import SamplingParams


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minirunner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="continue one or more prompts")
    gen.add_argument("prompts", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--model", default=None,
                     help="Hugging Face checkpoint directory (default: the embedded model)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--device", default="auto")
    gen.add_argument("--block-size", type=int, default=16)
    gen.add_argument("--num-kv-blocks", type=int, default=None)
    gen.add_argument("--max-model-len", type=int, default=None)
    gen.add_argument("--enable-prefix-caching", action="store_true")
    gen.add_argument("--attention-backend", default="auto",
                     choices=["auto", "torch", "triton", "flashinfer"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, seed=args.seed, stop=args.stop,
                                ignore_eos=args.ignore_eos)
        llm = LLM(model=args.model, dtype=args.dtype, device=args.device,
                  block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                  max_model_len=args.max_model_len,
                  enable_prefix_caching=args.enable_prefix_caching,
                  attention_backend=args.attention_backend)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    outputs = llm.generate(args.prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    failed = 0
    for out in outputs:
        if out.error:
            failed += 1
            print(f"error: {out.error}", file=sys.stderr)
            continue
        print(f"{out.prompt}{out.outputs[0].text}")
        print()
    n_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    n_in = sum(len(o.prompt_token_ids) for o in outputs if not o.error)
    backend = llm.engine.backend.name
    print(f"[{len(outputs) - failed} requests, {n_in} prompt + {n_out} generated tokens in "
          f"{elapsed:.2f} s: {n_out / max(elapsed, 1e-9):.1f} tok/s; device "
          f"{llm.engine.config.device}, {llm.engine.config.dtype}, backend {backend}]")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

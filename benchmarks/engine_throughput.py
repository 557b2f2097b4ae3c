"""Engine throughput: what continuous batching and prefix caching buy, measured side by side in one run.

Prints a table and writes JSON (``--out``). Figures are for the machine it runs on; on a CPU they show the
runner's behaviour, not GPU speed. Usage:
    python benchmarks/engine_throughput.py [--model DIR] [--out benchmarks/results/engine_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path

import torch

from minirunner import LLM, SamplingParams


def run_batch(llm: LLM, prompts, params) -> dict:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    cached = sum(o.metrics.num_cached_prompt_tokens for o in outs)
    ttft = sorted(o.metrics.time_to_first_token for o in outs)
    return dict(requests=len(prompts), prompt_tokens=prompt_tokens, generated_tokens=generated,
                cached_prompt_tokens=cached, seconds=round(elapsed, 4),
                output_tok_per_s=round(generated / elapsed, 1),
                median_ttft_s=round(ttft[len(ttft) // 2], 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: embedded)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = random.Random(0)
    llm = LLM(args.model, device=args.device)
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(16, 64))] for _ in range(16)]
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up

    results: dict = dict(device=str(llm.engine.config.device), dtype=str(llm.engine.config.dtype),
                         torch=torch.__version__, machine=platform.machine(),
                         threads=torch.get_num_threads(), max_tokens=args.max_tokens, batching=[])
    print(f"{'batch':>5} {'tok/s':>8} {'seconds':>8} {'median TTFT s':>14}")
    for n in (1, 4, 16):
        r = run_batch(llm, prompts[:n], params)
        results["batching"].append(r)
        print(f"{n:>5} {r['output_tok_per_s']:>8} {r['seconds']:>8} {r['median_ttft_s']:>14}")
    one = results["batching"][0]["output_tok_per_s"]
    print(f"batch 16 vs batch 1 throughput: {results['batching'][-1]['output_tok_per_s'] / one:.2f}x")

    prefix = [rng.randrange(3, vocab) for _ in range(96)]
    shared = [prefix + [rng.randrange(3, vocab) for _ in range(8)] for _ in range(8)]
    results["prefix_caching"] = {}
    for enabled in (False, True):
        llm_pc = LLM(args.model, device=args.device, enable_prefix_caching=enabled)
        r = run_batch(llm_pc, shared, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        results["prefix_caching"]["on" if enabled else "off"] = r
    off, on = results["prefix_caching"]["off"], results["prefix_caching"]["on"]
    print(f"prefix caching, 8 prompts sharing 96 tokens: off {off['seconds']} s, on {on['seconds']} s "
          f"({on['cached_prompt_tokens']} of {on['prompt_tokens']} prompt tokens from the cache)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

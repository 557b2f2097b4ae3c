"""Engine throughput: what continuous batching and prefix caching buy, measured side by side in one run.

Prints a table and writes JSON (``--out``). Figures are for the machine it runs on; on a CPU they show the
runner's behaviour, not GPU speed. Every run goes through ``minirunner.tools.bench.run_minirunner``. Usage:
    python benchmarks/engine_throughput.py [--model DIR] [--out benchmarks/results/engine_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from minirunner import LLM
from minirunner.tools.bench import Workload, environment, run_minirunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: embedded)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    rng = random.Random(0)
    llm = LLM(args.model, device=args.device)
    vocab = llm.engine.model_config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(16, 64))] for _ in range(16)]
    run_minirunner(llm, Workload("warm-up", prompts[:2], [4, 4], "warm-up"))

    results: dict = dict(environment=environment(), max_tokens=args.max_tokens, batching=[])
    print(f"{'batch':>5} {'tok/s':>8} {'seconds':>8} {'median TTFT s':>14}")
    for n in (1, 4, 16):
        r = run_minirunner(llm, Workload(f"batch {n}", prompts[:n], [args.max_tokens] * n, f"batch {n}"))
        results["batching"].append(r.as_dict(with_timeline=False))
        print(f"{n:>5} {r.output_tok_per_s:>8.1f} {r.seconds:>8.3f} {r.ttft_p50:>14.4f}")
    one = results["batching"][0]["output_tok_per_s"]
    print(f"batch 16 vs batch 1 throughput: {results['batching'][-1]['output_tok_per_s'] / one:.2f}x")

    prefix = [rng.randrange(3, vocab) for _ in range(96)]
    shared = Workload("shared prefix", [prefix + [rng.randrange(3, vocab) for _ in range(8)]
                                        for _ in range(8)], [8] * 8, "8 prompts sharing 96 tokens")
    results["prefix_caching"] = {}
    for enabled in (False, True):
        llm_pc = LLM(args.model, device=args.device, enable_prefix_caching=enabled)
        r = run_minirunner(llm_pc, shared)
        results["prefix_caching"]["on" if enabled else "off"] = r.as_dict(with_timeline=False)
    off, on = results["prefix_caching"]["off"], results["prefix_caching"]["on"]
    print(f"prefix caching, 8 prompts sharing 96 tokens: off {off['seconds']:.3f} s, "
          f"on {on['seconds']:.3f} s "
          f"({on['cached_prompt_tokens']} of {on['prompt_tokens']} prompt tokens from the cache)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""What issue 12's engine changes buy, measured side by side in one run on the embedded model.

1. Detokenisation per output token: re-decoding the whole output every step (the old stop check and
   stream) against the incremental detokenizer, at several output lengths (seconds per token; ratio).
2. Parallel sampling: peak KV blocks in use for one prompt with ``n=4`` (prompt blocks shared,
   copy-on-write) against four separate requests, from the step trace.
Figures are for the machine it runs on (timings on a shared CPU are noisy: medians of repeats).
Usage: python benchmarks/api_parity.py [--out benchmarks/results/api_parity_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from minirunner import LLM, SamplingParams
from minirunner.engine.detokenizer import IncrementalDetokenizer


def detok_cost(tokenizer, token_ids: list[int], repeats: int = 3) -> dict:
    def full():
        for j in range(1, len(token_ids) + 1):
            tokenizer.decode(token_ids[:j], skip_special_tokens=True)

    def incremental():
        d = IncrementalDetokenizer(tokenizer)
        for t in token_ids:
            d.append(t)
            d.take_delta()

    out = {}
    for name, fn in (("full_redecode", full), ("incremental", incremental)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[f"{name}_us_per_token"] = round(1e6 * statistics.median(times) / len(token_ids), 2)
    out["ratio"] = round(out["full_redecode_us_per_token"] / out["incremental_us_per_token"], 2)
    return out


def peak_blocks(llm: LLM, prompts, params) -> int:
    llm.clear_step_trace()
    llm.generate(prompts, params, use_tqdm=False)
    return max(t["blocks_used"] for t in llm.get_step_trace())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    llm = LLM(device="cpu", block_size=16)
    tok = llm.get_tokenizer()
    text = llm.generate(["ROMEO."], SamplingParams(temperature=0.8, seed=1, max_tokens=512,
                                                   ignore_eos=True), use_tqdm=False)[0]
    base = text.outputs[0].token_ids
    results = {"detokenize": {}, "parallel_sampling": {}}
    for n in (128, 512, 2048):
        ids = (base * (n // len(base) + 1))[:n]
        results["detokenize"][n] = detok_cost(tok, ids)
        print(f"detokenise {n:5d} tokens: {results['detokenize'][n]}")
    prompt = tok.encode("ROMEO. " * 20)[:100]  # 100 tokens: 6 full blocks of 16 and a partial one
    for max_tokens in (16, 64):
        sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=max_tokens, ignore_eos=True)
        n4 = peak_blocks(llm, [prompt], SamplingParams(n=4, temperature=0.8, seed=3,
                                                       max_tokens=max_tokens, ignore_eos=True))
        separate = peak_blocks(llm, [prompt] * 4, sampled)
        results["parallel_sampling"][max_tokens] = dict(prompt_tokens=len(prompt), n4_peak_blocks=n4,
                                                        separate_peak_blocks=separate)
        print(f"n=4, max_tokens {max_tokens}: peak blocks {n4} (n=4) vs {separate} (4 separate)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

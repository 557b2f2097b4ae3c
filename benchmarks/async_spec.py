"""Speculative steps scheduled ahead (``async_scheduling=True``) against the synchronous speculative engine
and plain decoding, interleaved in one process: the three engines (same graph mode, the embedded pair,
the draft model) take turns on the same prompts, the order alternating every round, so the drift of a
shared host falls on all three alike. Prints per-round and median ratios of wall time; writes JSON.

    python benchmarks/async_spec.py --rounds 8 --out benchmarks/results/async_spec_cpu.json

On a CPU the device is the host, so launching ahead overlaps nothing; what differs is the work itself
(the draft's first pass is one replay of a 2-token bucket instead of an eager catch-up pass, the next
step's inputs are tensor ops instead of host bookkeeping). The overlap it exists for needs a GPU
(``--device cuda --graph-mode cuda``; scripts/gpu_check.sh runs benchmarks/spec_decode.py with it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from minirunner import LLM, SamplingParams
from minirunner.tools.bench import environment
from minirunner.tools.bench.workloads import make_workload

ENGINES = ("async", "synchronous", "plain")


def build(name: str, args) -> LLM:
    spec = None if name == "plain" else {"method": "draft_model", "num_speculative_tokens": args.k}
    return LLM(None, device=args.device, graph_mode=args.graph_mode, max_num_seqs=args.batch,
               num_threads=args.num_threads if args.num_threads == "auto" else int(args.num_threads),
               speculative_config=spec, async_scheduling=name == "async")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="max_num_seqs")
    ap.add_argument("--num-requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--workload", default="text", choices=["text", "repetitive"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--graph-mode", default="compile", choices=["compile", "cuda"])
    ap.add_argument("--num-threads", default="1")
    ap.add_argument("--out", default="benchmarks/results/async_spec_cpu.json")
    args = ap.parse_args()
    llms = {name: build(name, args) for name in ENGINES}
    engine = llms["plain"].engine
    wl = make_workload(args.workload, args.num_requests, engine.model_config.vocab_size,
                       engine.config.max_model_len, 0, (8, 8), (args.max_tokens, args.max_tokens),
                       tokenizer=llms["plain"].get_tokenizer())
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in wl.max_tokens]
    outputs = {}
    for name, llm in llms.items():  # untimed: every bucket compiles or captures here
        outputs[name] = [o.outputs[0].token_ids for o in llm.generate(wl.prompts, params, use_tqdm=False)]
    assert outputs["async"] == outputs["synchronous"] == outputs["plain"], "greedy outputs differ"
    seconds = {name: [] for name in ENGINES}
    for rnd in range(args.rounds):
        order = ENGINES if rnd % 2 == 0 else ENGINES[::-1]
        for name in order:
            llm = llms[name]
            llm.clear_step_trace()
            t0 = time.perf_counter()
            llm.generate(wl.prompts, params, use_tqdm=False)
            seconds[name].append(time.perf_counter() - t0)
        print(f"round {rnd}: " + ", ".join(f"{n} {seconds[n][-1]:.3f} s" for n in ENGINES), flush=True)
    tokens = sum(wl.max_tokens)
    ahead = [t for t in llms["async"].get_step_trace() if t["scheduled_ahead"]]

    def ratio(slow: str, fast: str) -> dict:
        r = [a / b for a, b in zip(seconds[slow], seconds[fast], strict=True)]
        return dict(median=statistics.median(r), min=min(r), max=max(r))

    stats = llms["async"].engine.spec.stats
    summary = dict(
        environment=environment(), settings=vars(args), output_tokens_per_round=tokens,
        output_tok_per_s={n: statistics.median(tokens / s for s in seconds[n]) for n in ENGINES},
        async_vs_synchronous=ratio("synchronous", "async"), async_vs_plain=ratio("plain", "async"),
        synchronous_vs_plain=ratio("plain", "synchronous"),
        steps_scheduled_ahead_last_round=len(ahead), steps_last_round=len(llms["async"].get_step_trace()),
        alpha=stats.alpha, mean_accepted_length=stats.mean_accepted_length, seconds=seconds)
    for key in ("async_vs_synchronous", "async_vs_plain", "synchronous_vs_plain"):
        r = summary[key]
        print(f"-> {key}: x{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    print("-> output tok/s (median): " + ", ".join(f"{n} {v:.1f}" for n, v in
                                                   summary["output_tok_per_s"].items()))
    print(f"-> steps scheduled ahead in the last round: {len(ahead)} of {summary['steps_last_round']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Speculative decoding on the embedded pair at batch 1, side by side in one run: plain decoding, the
draft-model and n-gram proposers, and transformers' greedy and assisted generation (assistant_model=the
same draft) on the same prompts.

Prints a table and writes JSON (``--out``). Each figure is the median of ``--reps`` timed passes over all
prompts (after one warm-up pass), taken in the same process so that load from other work hits all modes
alike; speedups are ratios to plain decoding of the same runner (and to transformers' own greedy
generate for assisted generation). CPU, eager (no graph mode). Usage:
    python benchmarks/spec_decode.py [--k 3] [--max-tokens 64] [--reps 3] [--out FILE]
(written as a script because ``minirunner bench`` was not on main yet.)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from minirunner import LLM, SamplingParams
from minirunner.assets import default_draft_dir, default_model_dir

PROMPTS = ["ROMEO:\nBut soft, what light through yonder window breaks?",
           "KING HENRY:\nOnce more unto the breach, dear friends, once more;",
           "HAMLET:\nTo be, or not to be, that is the question:",
           "First Citizen:\nBefore we proceed any further, hear me speak."]
# Repetitive text: the continuation of a passage the prompt already holds twice.
_PASSAGE = ("KING RICHARD:\nA horse! a horse! my kingdom for a horse!\nCATESBY:\nWithdraw, my lord; "
            "I'll help you to a horse.\n")
REPETITIVE = [_PASSAGE * 2 + _PASSAGE[:n] for n in (14, 30, 52, 70)]


def _time_runner(llm: LLM, prompts, params, reps: int) -> tuple[float, list[list[int]]]:
    def one_pass():
        return [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    out = one_pass()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _time_hf(model, tokenizer, prompts, max_tokens, reps, assistant=None) -> float:
    ids = [torch.tensor([tokenizer.encode(p)]) for p in prompts]
    kw = dict(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0)
    if assistant is not None:
        kw["assistant_model"] = assistant

    def one_pass():
        with torch.inference_mode():
            for x in ids:
                model.generate(x, **kw)
    one_pass()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results/spec_decode_cpu.json")
    args = parser.parse_args()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    common = dict(device="cpu", attention_backend="torch")
    plain = LLM(**common)
    draft = LLM(**common, speculative_config={"method": "draft_model", "num_speculative_tokens": args.k})
    ngram = LLM(**common, speculative_config={"method": "ngram", "num_speculative_tokens": args.k,
                                             "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    rows = {}
    sets = (("shakespeare", PROMPTS[:args.num_prompts]), ("repetitive", REPETITIVE[:args.num_prompts]))
    for name, prompts in sets:
        t_plain, ref = _time_runner(plain, prompts, params, args.reps)
        n_tokens = sum(len(r) for r in ref)
        rows[f"{name}/plain"] = dict(seconds=t_plain, tok_per_s=n_tokens / t_plain, speedup=1.0)
        for label, llm in (("draft_model", draft), ("ngram", ngram)):
            llm.engine.spec.stats.__init__()  # metrics of the timed passes only
            t, out = _time_runner(llm, prompts, params, args.reps)
            assert out == ref, f"{label} changed the greedy output"
            m = llm.get_spec_metrics()
            steps, k = m["num_steps"], args.k
            c = (m["propose_s"] / (steps * k)) / (m["verify_s"] / steps) if steps else None
            rows[f"{name}/{label}"] = dict(
                seconds=t, tok_per_s=n_tokens / t, speedup=t_plain / t, alpha=m["alpha"],
                mean_accepted_length=m["mean_accepted_length"], cost_ratio_c=c)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(default_model_dir())
    target = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    assistant = AutoModelForCausalLM.from_pretrained(default_draft_dir(), dtype=torch.float32).eval()
    for name, prompts in sets:
        t_hf = _time_hf(target, tok, prompts, args.max_tokens, args.reps)
        t_as = _time_hf(target, tok, prompts, args.max_tokens, args.reps, assistant)
        rows[f"{name}/hf_greedy"] = dict(seconds=t_hf, speedup_vs_minirunner_plain=rows[
            f"{name}/plain"]["seconds"] / t_hf)
        rows[f"{name}/hf_assisted"] = dict(seconds=t_as, speedup_vs_hf_greedy=t_hf / t_as)
    print(f"batch 1, k={args.k}, {args.max_tokens} tokens per prompt, median of {args.reps} passes")
    for key, row in rows.items():
        print(f"{key:28s} " + "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in row.items()))
    out = dict(machine=platform.processor() or platform.machine(), torch=torch.__version__,
               threads=torch.get_num_threads(), k=args.k, max_tokens=args.max_tokens,
               reps=args.reps, num_prompts=args.num_prompts, mode="eager", results=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

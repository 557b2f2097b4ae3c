"""Serving throughput on one GPU: nano-vllm's workload (256 sequences, input and output lengths uniform in
100–1024, EOS ignored) on a Qwen3-0.6B-shaped model with random bf16 weights built locally from a config,
through minirunner, and the same kind of requests through transformers ``generate`` for a smaller sample.

Owns measurement only. ``python benchmarks/gpu_serving.py --out report.json`` on a CUDA machine;
``--dry-run`` runs a tiny model and workload on the CPU to check the script. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minirunner import LLM  # noqa: E402
from minirunner.tools.bench import make_workload, run_minirunner, run_transformers  # noqa: E402

# Qwen3-0.6B's shape (its config.json); the weights are random.
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                 max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=True,
            max_position_embeddings=512)


def build_model(root: Path, shape: dict, dtype: torch.dtype) -> str:
    """Save a random-weight Qwen3 checkpoint (config.json + safetensors) under root; returns the dir."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(config).to(dtype)
    path = root / "qwen3_shape"
    model.save_pretrained(path, safe_serialization=True)
    del model
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--hf-num-seqs", type=int, default=16, help="requests in the transformers sample")
    ap.add_argument("--hf-max-output-len", type=int, default=256,
                    help="cap on the sample's output lengths: a static batch runs as many steps as its "
                         "longest output, about 25 ms each eager on an H200, so 1024 outputs overran "
                         "the prepared run's time")
    args = ap.parse_args()
    dry = args.dry_run or not torch.cuda.is_available()
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    shape, n = (TINY, 8) if dry else (QWEN3_06B, args.num_seqs)
    lens = ((8, 32), (8, 32)) if dry else ((100, 1024), (100, 1024))
    report: dict = dict(mode="dry-run" if dry else "gpu", model_shape=shape, dtype=str(dtype))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model_dir = build_model(Path(tmp), shape, dtype)
        report["build_model_s"] = round(time.perf_counter() - t0, 1)
        llm = LLM(model_dir, dtype=dtype, device=device, max_model_len=2048 if not dry else 128,
                  max_num_seqs=256 if not dry else 8, max_num_batched_tokens=16384 if not dry else 256)
        wl = make_workload("nano", n, shape["vocab_size"], llm.engine.config.max_model_len, 0, *lens)
        run_minirunner(llm, make_workload("fixed", 2, shape["vocab_size"], 64, 0, (8, 8), (4, 4)))
        mr = run_minirunner(llm, wl, "minirunner")
        report["minirunner"] = mr.as_dict(with_timeline=False)
        print(f"minirunner: {mr.output_tok_per_s:.0f} output tok/s ({n} seqs, backend "
              f"{llm.engine.backend.name}, peak {mr.peak_concurrent_seqs} seqs)", flush=True)
        cfg = llm.engine.config
        del llm
        if device == "cuda":
            torch.cuda.empty_cache()
        cap = args.hf_max_output_len
        sample = make_workload("nano", min(args.hf_num_seqs, n), shape["vocab_size"], cfg.max_model_len, 0,
                               lens[0], (min(lens[1][0], cap), min(lens[1][1], cap)))
        hf = run_transformers(model_dir, sample, len(sample), dtype, torch.device(device),
                              f"transformers generate (one static batch of {len(sample)})")
        report["transformers"] = hf.as_dict(with_timeline=False)
        report["ratio_output_tok_per_s"] = mr.output_tok_per_s / hf.output_tok_per_s
        report["transformers_sample"] = dict(num_seqs=len(sample), max_output_len=cap)
        print(f"transformers: {hf.output_tok_per_s:.0f} output tok/s on {len(sample)} seqs (outputs "
              f"capped at {cap} tokens); minirunner / "
              f"transformers = {report['ratio_output_tok_per_s']:.2f}x", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

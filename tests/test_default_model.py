"""The embedded default model pair: loadable offline, safe on disk, shipped in the wheel, and served
by minirunner exactly as transformers serves it (greedy tokens identical in float32)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from minirunner.assets import default_draft_dir, default_model_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_DIRS = {"target": default_model_dir(), "draft": default_draft_dir()}
SIZE_LIMIT = 8 * 1000 * 1000  # bytes per directory
REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors",
                  "tokenizer.json", "tokenizer_config.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".npy", ".npz")
PROMPTS = ["ROMEO.\n", "To be, or not to be", "KING HENRY.\nOnce more unto the breach, dear friends"]


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _safetensors_header(path: Path) -> dict:
    """Parse the safetensors header by hand: u64 little-endian length, then JSON."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max(v["data_offsets"][1] for v in tensors.values())
    assert 8 + n + end == len(raw), f"{path} has trailing or missing bytes"
    return tensors


@pytest.mark.parametrize("which", ["target", "draft"])
def test_files_are_safetensors_and_small(which: str) -> None:
    d = MODEL_DIRS[which]
    names = {p.name for p in d.iterdir()}
    for required in REQUIRED_FILES:
        assert required in names, f"{which}: {required} missing from {d.name}/"
    pickled = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    assert not pickled, f"{which}: pickled files shipped: {pickled}"
    tensors = _safetensors_header(d / "model.safetensors")
    dtypes = {v["dtype"] for v in tensors.values()}
    assert dtypes <= {"BF16", "F16"}, f"{which}: weights stored as {dtypes}"
    size = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
    assert size < SIZE_LIMIT, f"{which}: {size} bytes >= {SIZE_LIMIT}"


def test_transformers_loads_both_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(monkeypatch)
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    target_tok = AutoTokenizer.from_pretrained(MODEL_DIRS["target"])
    draft_tok = AutoTokenizer.from_pretrained(MODEL_DIRS["draft"])
    assert target_tok.get_vocab() == draft_tok.get_vocab(), "draft must share the target's tokenizer"
    text = "ROMEO.\nBut soft, what light through yonder window breaks?\n  'Tis the east; 3 & 4!"
    ids = target_tok(text, add_special_tokens=False).input_ids
    assert len(ids) < len(text), "BPE should merge characters"
    assert target_tok.decode(ids) == text, "byte-level BPE must decode back to the same text"
    assert target_tok.eos_token is not None
    configs = []
    for which, d in MODEL_DIRS.items():
        model = AutoModelForCausalLM.from_pretrained(d)
        gen = GenerationConfig.from_pretrained(d)
        assert model.config.eos_token_id == target_tok.eos_token_id, which
        assert gen.eos_token_id == target_tok.eos_token_id, which
        assert model.config.vocab_size == len(target_tok), which
        configs.append(model.config)
    target_cfg, draft_cfg = configs
    assert target_cfg.num_hidden_layers > draft_cfg.num_hidden_layers
    assert target_cfg.hidden_size > draft_cfg.hidden_size


def test_shipped_figures_describe_shipped_weights() -> None:
    """metrics.json (written by scripts/eval_tiny.py) must belong to these weights and meet the bar."""
    assets = default_model_dir().parent
    metrics = json.loads((assets / "metrics.json").read_text())
    for which, d in MODEL_DIRS.items():
        digest = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
        recorded = metrics["training"]["sha256"][f"{which}/model.safetensors"]
        assert digest == recorded, f"{which} weights changed since they were evaluated: rerun eval"
    ho = metrics["held_out"]
    assert ho["target_nll"] < ho["draft_nll"] < ho["unigram_nll"]
    assert ho["alpha"] >= 0.7
    assert metrics["flops_ratio_dense"] >= 4.0
    card = (assets / "MODEL_CARD.md").read_text()
    assert f"{ho['alpha']:.4f}" in card and f"{ho['target_nll']:.4f}" in card


def _hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt_ids]), do_sample=False,
                         max_new_tokens=max_new_tokens)
    return out[0, len(prompt_ids):].tolist()


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    """Tokens up to and excluding the first EOS (transformers pads after it; runners may not)."""
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def test_default_model_greedy_matches_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(monkeypatch)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minirunner import LLM, SamplingParams

    max_new = 40
    llm = LLM(dtype="float32", device="cpu")  # model=None: the embedded default
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=max_new),
                        use_tqdm=False)
    tok = AutoTokenizer.from_pretrained(default_model_dir())
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    eos = tok.eos_token_id
    for prompt, out in zip(PROMPTS, outs, strict=True):
        prompt_ids = tok(prompt).input_ids
        assert list(out.prompt_token_ids) == prompt_ids, prompt
        ours = list(out.outputs[0].token_ids)
        with torch.no_grad():
            ref = _hf_greedy(hf, prompt_ids, max_new)
        assert _until_eos(ours, eos) == _until_eos(ref, eos), (
            f"prompt {prompt!r}:\nminirunner   {tok.decode(ours)!r}\ntransformers {tok.decode(ref)!r}")
        assert len(_until_eos(ref, eos)) > 0, "the default model should continue these prompts"


def test_cli_generates_with_default_model_offline(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "minirunner", "generate", "ROMEO."],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # stdout: prompt + continuation, a blank line, then a one-line "[... tok/s ...]" summary
    body = proc.stdout.rstrip().rsplit("\n[", 1)[0]
    assert body.startswith("ROMEO."), f"prompt not echoed; stdout={proc.stdout!r}"
    assert body[len("ROMEO."):].strip(), f"no continuation printed; stdout={proc.stdout!r}"


def test_wheel_ships_the_assets(tmp_path: Path) -> None:
    """Build the wheel from a copy of the working tree (no network) and look inside it."""
    src = tmp_path / "src"
    shutil.copytree(REPO_ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "data", "build", "dist", "wheels", "*.egg-info", "__pycache__", ".pytest_cache",
        ".ruff_cache", ".ipynb_checkpoints"))
    out = tmp_path / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", str(src), "-w", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = out.glob("minirunner-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "minirunner/assets/shakespeare/MODEL_CARD.md" in names
        for which, d in MODEL_DIRS.items():
            for f in REQUIRED_FILES:
                member = f"minirunner/assets/shakespeare/{which}/{f}"
                assert member in names, f"{member} not in {wheel.name}"
                assert zf.read(member) == (d / f).read_bytes(), f"{member} differs from the tree"

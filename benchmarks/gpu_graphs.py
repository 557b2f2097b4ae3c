"""Eager vs CUDA-graph decode on one GPU: tok/s at batch 1, 8 and 64 on the Qwen3-0.6B-shaped model with
random bf16 weights (built locally, as benchmarks/gpu_serving.py does), the HBM-roofline fraction at
batch 1 (weight bytes read per step / step time, against a measured device copy bandwidth), graph vs
eager greedy agreement, and a replay under ``torch.cuda.set_sync_debug_mode("error")``.

Owns measurement only. ``python benchmarks/gpu_graphs.py --out report.json`` on a CUDA machine;
``--dry-run`` (or no CUDA) runs a tiny model eager on the CPU to check the script. Nothing is downloaded.
Written for the GPU check; not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_serving import QWEN3_06B, TINY, build_model  # noqa: E402

from minirunner import LLM, SamplingParams  # noqa: E402
from minirunner.worker.cudagraph import GraphKey, GraphKind  # noqa: E402

BATCHES = (1, 8, 64)
PROMPT_LEN = 32


def decode_steps(llm: LLM, batch: int, steps: int, vocab: int) -> tuple[list[float], list[list[int]]]:
    """Wall time of each of ``steps`` decode steps of ``batch`` requests (the step's token copy back to
    the host ends each one, so no extra sync is needed), and the requests' tokens."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True)
    ids = [engine.add_request([(7 * i + j) % (vocab - 3) + 3 for j in range(PROMPT_LEN)], params)
           for i in range(batch)]
    for _ in range(3):  # prefill, then warm decode steps
        engine.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    tokens = [list(engine.requests[r].output_token_ids) for r in ids]
    for r in ids:
        engine.abort_request(r)
    engine.requests.clear()
    return times, tokens


def copy_bandwidth_gb_s() -> float:
    """Device copy bandwidth (read + write bytes / time) of a 1 GiB buffer, median of 5 timed copies."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y.copy_(x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * x.numel() / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    dry = args.dry_run or not torch.cuda.is_available()
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    shape = TINY if dry else QWEN3_06B
    steps = 4 if dry else args.steps
    modes = ("none", "none") if dry else ("none", "cuda")  # no CUDA graph without CUDA
    report: dict = dict(mode="dry-run" if dry else "gpu", model_shape=shape, dtype=str(dtype), batches={})
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp), shape, dtype)
        kw = dict(dtype=dtype, device=device, max_model_len=512 if not dry else 128,
                  max_num_seqs=max(BATCHES), cudagraph_capture_sizes=list(BATCHES),
                  kv_cache_memory_bytes=(4 << 30) if not dry else None)
        t0 = time.perf_counter()
        engines = {label: LLM(model_dir, graph_mode=mode, **kw)
                   for label, mode in zip(("eager", "graph"), modes, strict=True)}
        report["load_and_capture_s"] = round(time.perf_counter() - t0, 1)
        report["backend"] = engines["graph"].engine.backend.name
        for batch in BATCHES:
            row, tokens = {}, {}
            for label, llm in engines.items():
                times, tokens[label] = decode_steps(llm, batch, steps, shape["vocab_size"])
                step = statistics.median(times)
                row[label] = dict(median_step_ms=step * 1e3, min_step_ms=min(times) * 1e3,
                                  max_step_ms=max(times) * 1e3, tok_per_s=batch / step)
            row["graph_over_eager"] = row["graph"]["tok_per_s"] / row["eager"]["tok_per_s"]
            same = sum(a == b for a, b in zip(tokens["eager"], tokens["graph"], strict=True))
            row["greedy_identical_requests"] = f"{same}/{batch}"
            report["batches"][str(batch)] = row
            print(f"batch {batch:3d}: eager {row['eager']['tok_per_s']:9.0f} tok/s, graph "
                  f"{row['graph']['tok_per_s']:9.0f} tok/s, x{row['graph_over_eager']:.2f}; greedy identical "
                  f"{same}/{batch}", flush=True)
        if not dry:
            graph_llm = engines["graph"]
            seen, weight_bytes = set(), 0
            for p in graph_llm.engine.model.parameters():
                if p.untyped_storage().data_ptr() not in seen:  # fused views share one storage
                    seen.add(p.untyped_storage().data_ptr())
                    weight_bytes += p.untyped_storage().nbytes()
            bw = copy_bandwidth_gb_s()
            step_s = report["batches"]["1"]["graph"]["median_step_ms"] / 1e3
            report["roofline_batch1"] = dict(weight_bytes=weight_bytes, copy_gb_s=bw,
                                             achieved_gb_s=weight_bytes / step_s / 1e9,
                                             fraction=weight_bytes / step_s / 1e9 / bw)
            print(f"batch 1: {weight_bytes / 1e9:.2f} GB of weights per step at "
                  f"{weight_bytes / step_s / 1e9:.0f} GB/s = {report['roofline_batch1']['fraction']:.0%} of "
                  f"the measured copy bandwidth {bw:.0f} GB/s", flush=True)
            runner = graph_llm.engine.runner
            graph = runner.graphs.cuda_graph(GraphKey(1, GraphKind.GREEDY))
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                graph.replay()
                report["replay_syncs"] = "none (set_sync_debug_mode('error') raised nothing)"
            except RuntimeError as e:
                report["replay_syncs"] = f"a sync during replay: {e}"
            finally:
                torch.cuda.set_sync_debug_mode("default")
            print("replay:", report["replay_syncs"], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

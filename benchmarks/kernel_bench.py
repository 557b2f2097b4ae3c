"""Kernel micro-benchmark: each Triton kernel against its torch twin, and decode attention's effective
bandwidth against the device's measured copy bandwidth. Writes one JSON report.

Owns measurement only (the kernels live in ``minirunner/kernels/``). On a GPU:
``python benchmarks/kernel_bench.py --out report.json``. ``--dry-run`` runs tiny shapes on CPU
(Triton interpreter) to check the script.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minirunner.kernels.input_prep import prepare_inputs, prepare_inputs_ref  # noqa: E402
from minirunner.kernels.paged_attention import (  # noqa: E402
    paged_decode,
    paged_decode_ref,
    paged_prefill,
    paged_prefill_ref,
    store_kv,
    store_kv_ref,
)
from minirunner.kernels.sampling import sample, sample_ref  # noqa: E402
from minirunner.kernels.testing import random_paged_batch  # noqa: E402


def time_ms(fn, device: torch.device, reps: int) -> float:
    """Median milliseconds of fn() (CUDA events around each call, after warm-up)."""
    fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)  # > H200's 60 MB L2
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbps(device: torch.device, nbytes: int, reps: int) -> float:
    """Device-to-device copy: reads and writes nbytes each, so 2 * nbytes move per copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, reps)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def bench_decode(cfg, device, dtype, reps, copy_gbps):
    b = random_paged_batch([cfg["seq_len"]] * cfg["batch"], [1] * cfg["batch"], cfg["q_heads"],
                           cfg["kv_heads"], cfg["head_dim"], cfg["block_size"], dtype, device)
    scale = cfg["head_dim"] ** -0.5
    args = (b.q, b.kv_cache, b.block_tables, b.seq_lens, scale)
    elem = torch.tensor([], dtype=dtype).element_size()
    kv_bytes = 2 * cfg["batch"] * cfg["seq_len"] * cfg["kv_heads"] * cfg["head_dim"] * elem
    io_bytes = 2 * b.q.numel() * elem + b.block_tables.numel() * 4
    must_read = kv_bytes + io_bytes
    out = {"shape": cfg, "dtype": str(dtype), "bytes_moved": must_read}
    ms = time_ms(lambda: paged_decode(*args), device, reps)
    out["triton_ms"] = ms
    out["triton_GBps"] = must_read / (ms * 1e-3) / 1e9
    out["fraction_of_copy_bandwidth"] = out["triton_GBps"] / copy_gbps if copy_gbps else None
    out["twin_ms"] = time_ms(lambda: paged_decode_ref(*args), device, max(1, reps // 4))
    out["max_abs_err_vs_twin"] = _err(paged_decode(*args), paged_decode_ref(*args))
    out["flashinfer"] = bench_flashinfer_decode(b, cfg, dtype, device, reps, must_read)
    return out


def bench_flashinfer_decode(b, cfg, dtype, device, reps, must_read):
    try:
        flashinfer = importlib.import_module("flashinfer")
    except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
        return {"available": False, "reason": f"import flashinfer failed: {e!r}"}
    if device.type != "cuda":
        return {"available": False, "reason": "needs CUDA"}
    try:
        from minirunner.attention.flashinfer_pagetable import block_tables_to_csr

        indptr, indices, last = block_tables_to_csr(b.block_tables.cpu(), b.seq_lens.cpu(),
                                                    cfg["block_size"])
        ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="NHD",
                                                          use_tensor_cores=True)
        w.plan(indptr, indices, last, cfg["q_heads"], cfg["kv_heads"], cfg["head_dim"],
               cfg["block_size"], pos_encoding_mode="NONE", q_data_type=dtype,
               kv_data_type=dtype, sm_scale=cfg["head_dim"] ** -0.5)
        ms = time_ms(lambda: w.run(b.q, b.kv_cache), device, reps)
        ref = paged_decode_ref(b.q, b.kv_cache, b.block_tables, b.seq_lens, cfg["head_dim"] ** -0.5)
        return {"available": True, "version": getattr(flashinfer, "__version__", "?"), "ms": ms,
                "GBps": must_read / (ms * 1e-3) / 1e9,
                "max_abs_err_vs_twin": _err(w.run(b.q, b.kv_cache), ref)}
    except Exception as e:  # noqa: BLE001 - report, do not abort the whole check
        return {"available": True, "error": repr(e)}


def bench_pair(name, triton_fn, twin_fn, device, reps, compare=None):
    row = {"kernel": name}
    row["triton_ms"] = time_ms(triton_fn, device, reps)
    row["twin_ms"] = time_ms(twin_fn, device, max(1, reps // 4))
    row["twin_over_triton"] = row["twin_ms"] / row["triton_ms"] if row["triton_ms"] else None
    if compare is not None:
        row["check"] = compare()
    return row


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    dry = args.dry_run
    reps = 2 if dry else args.reps
    report = {
        "mode": "dry-run (CPU, Triton interpreter, tiny shapes)" if dry else "gpu",
        "env": {"python": platform.python_version(), "torch": torch.__version__,
                "triton": importlib.import_module("triton").__version__,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"},
    }
    copy_bytes = (1 << 20) if dry else (1 << 30)
    report["copy_bandwidth_GBps"] = copy_bandwidth_gbps(device, copy_bytes, reps)
    dec_cfg = dict(batch=64, seq_len=2048, head_dim=128, kv_heads=8, q_heads=32, block_size=16)
    if dry:
        dec_cfg = dict(batch=2, seq_len=40, head_dim=64, kv_heads=2, q_heads=4, block_size=16)
    report["decode_attention"] = bench_decode(dec_cfg, device, dtype, reps,
                                              report["copy_bandwidth_GBps"])
    rows = []
    # prefill: 8 prompts of 512 tokens (dry: 2 of 20)
    n_seq, n_tok = (2, 20) if dry else (8, 512)
    hq, hkv, d = dec_cfg["q_heads"], dec_cfg["kv_heads"], dec_cfg["head_dim"]
    b = random_paged_batch([n_tok] * n_seq, [n_tok] * n_seq, hq, hkv, d, 16, dtype, device)
    pargs = (b.q, b.kv_cache, b.block_tables, b.query_start_loc, b.seq_lens, d**-0.5)
    rows.append(bench_pair("paged_prefill", lambda: paged_prefill(*pargs),
                           lambda: paged_prefill_ref(*pargs), device, reps,
                           lambda: {"max_abs_err": _err(paged_prefill(*pargs),
                                                        paged_prefill_ref(*pargs))}))
    # store_kv: one decode step's worth of tokens (64) and a prefill chunk (4096)
    for n in ((8,) if dry else (64, 4096)):
        k = torch.randn(n, hkv, d, device=device, dtype=dtype)
        v = torch.randn_like(k)
        cache = torch.zeros(n // 16 + 1, 2, 16, hkv, d, device=device, dtype=dtype)
        slots = torch.arange(n, device=device)

        def check(k=k, v=v, cache=cache, slots=slots):
            a, c = cache.clone(), cache.clone()
            store_kv(k, v, a, slots)
            store_kv_ref(k, v, c, slots)
            return {"equal": bool(torch.equal(a, c))}

        rows.append(bench_pair(f"store_kv[{n} tokens]", lambda k=k, v=v, c=cache, s=slots:
                               store_kv(k, v, c, s), lambda k=k, v=v, c=cache, s=slots:
                               store_kv_ref(k, v, c, s), device, reps, check))
    # prepare_inputs: 64 decode requests out of 256 state rows
    nreq, max_reqs, max_blocks = (4, 8, 4) if dry else (64, 256, 128)
    gen = torch.Generator().manual_seed(0)
    ins = (torch.randperm(max_reqs, generator=gen)[:nreq].int().to(device),
           torch.ones(nreq, dtype=torch.int32, device=device),
           torch.randint(0, 16 * max_blocks - 1, (max_reqs,), generator=gen,
                         dtype=torch.int32).to(device),
           torch.randint(0, 10000, (max_reqs, max_blocks), generator=gen,
                         dtype=torch.int32).to(device))

    def bufs():
        return (torch.empty(nreq, dtype=torch.int64, device=device),
                torch.empty(nreq, dtype=torch.int64, device=device),
                torch.empty(nreq, dtype=torch.int32, device=device),
                torch.empty(nreq + 1, dtype=torch.int32, device=device),
                torch.empty(nreq, max_blocks, dtype=torch.int32, device=device))

    pa, pb = bufs(), bufs()

    def check_prep():
        prepare_inputs(*ins, 16, *pa)
        prepare_inputs_ref(*ins, 16, *pb)
        return {"equal": all(bool(torch.equal(x, y)) for x, y in zip(pa, pb, strict=True))}

    rows.append(bench_pair("prepare_inputs[64 decode reqs]" if not dry else "prepare_inputs",
                           lambda: prepare_inputs(*ins, 16, *pa),
                           lambda: prepare_inputs_ref(*ins, 16, *pb), device, reps, check_prep))
    # sampling: 64 rows of a 128k vocabulary, temperature 0.8, no top-k/top-p
    rows_n, vocab = (4, 300) if dry else (64, 128 * 1024)
    logits = torch.randn(rows_n, vocab, device=device, dtype=dtype)
    sargs = (logits, torch.full((rows_n,), 0.8, device=device),
             torch.full((rows_n,), -1, dtype=torch.int64, device=device),
             torch.ones(rows_n, device=device),
             torch.arange(rows_n, dtype=torch.int64, device=device) + 7,
             torch.arange(rows_n, dtype=torch.int64, device=device) * 3)
    rows.append(bench_pair(f"sample[{rows_n}x{vocab}]",
                           lambda: sample(*sargs, apply_filters=False), lambda: sample_ref(*sargs),
                           device, reps, lambda: {"equal": bool(torch.equal(
                               sample(*sargs, apply_filters=False), sample_ref(*sargs)))}))
    report["kernels"] = rows
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (interpreter)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    args = p.parse_args(argv)
    args.device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: use --dry-run", file=sys.stderr)
        return 2
    if args.dry_run:
        args.dtype = "float32"
    t0 = time.time()
    report = run(args)
    report["wall_s"] = time.time() - t0
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

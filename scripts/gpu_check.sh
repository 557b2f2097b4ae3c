#!/usr/bin/env bash
# One prepared GPU run (at most 6 minutes on one H200: the per-block limits below add up to 345 s, the
# environment probe included; a block that runs out is reported as timed out): the gpu-marked tests, the
# kernel micro-benchmark, the serving benchmark (nano-vllm's workload on a Qwen3-0.6B-shaped random model,
# and transformers generate on a sample) and the graph benchmark (eager vs CUDA-graph decode tok/s at
# batch 1, 8, 64 on the same model shape, the HBM-roofline fraction at batch 1, graph vs eager greedy
# agreement, a replay under sync-debug "error") and speculative decoding at batch 1 under CUDA graphs
# (benchmarks/spec_decode.py, draft model vs plain, and scheduled ahead vs synchronous) and paged vs
# contiguous KV at equal memory on the ShareGPT-like workload (`minirunner bench --compare contiguous`,
# the CPU headline's settings) and, on a machine with two GPUs, LLM(tensor_parallel_size=2) over NCCL
# against one GPU (tests/test_gpu_tensor_parallel.py; skipped with a message on one GPU), with a JSON
# report in $OUT (or a fresh temporary folder, printed, when OUT is unset), and the course's one results
# file, benchmarks/results/gpu_run.json (simulators/gpu_results.py), which notebooks 04-07 load. The graph, speculative,
# paged-vs-contiguous and tensor-parallel blocks are written, not yet run on a GPU.
#   scripts/gpu_check.sh            on a CUDA machine
#   scripts/gpu_check.sh --dry-run  on any machine: imports, collection and the benchmark script on
#                                   tiny CPU shapes (Triton interpreter), to catch mistakes early
# Needs python with torch, triton, transformers, safetensors and pytest; nothing is installed and
# nothing is downloaded. FlashInfer is used when `import flashinfer` works, else reported unavailable.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
usage() {
    cat <<'USAGE'
usage: scripts/gpu_check.sh [--dry-run | --help]

One prepared GPU run (about 6 minutes on one H200): the gpu-marked tests and the kernel
micro-benchmark, with a JSON report in $OUT (or a fresh temporary folder, printed, when OUT is unset).

  (no option)  run it; needs a CUDA device
  --dry-run    on any machine: imports, collection and the benchmark script on tiny CPU shapes
               (Triton interpreter), to catch mistakes before spending GPU time
  -h, --help   print this help and exit (starts nothing)

Environment: OUT (report folder), PYTHON (interpreter, default python). Nothing is installed and
nothing is downloaded; FlashInfer is used when `import flashinfer` works.
USAGE
}
DRY=0
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY=1 ;;
    "") ;;
    *) echo "gpu_check: unknown option '$1'" >&2; usage >&2; exit 2 ;;
esac
REPORT_DIR="${OUT:-$(mktemp -d -t gpu_check.XXXXXX)}"
mkdir -p "$REPORT_DIR"
echo "gpu_check: report folder $REPORT_DIR"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
PY="${PYTHON:-python}"
T0=$(date +%s)

timeout 30 "$PY" - "$REPORT_DIR/env.json" <<'PYEOF'
import importlib, json, os, platform, sys
env = {"python": platform.python_version(),
       "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"}
for mod in ("torch", "triton", "transformers", "safetensors", "pytest", "flashinfer"):
    try:
        m = importlib.import_module(mod)
        env[mod] = getattr(m, "__version__", "present")
    except Exception as e:  # report, never stop here
        env[mod] = f"unavailable: {type(e).__name__}: {e}"
import torch
env["cuda_available"] = torch.cuda.is_available()
env["cuda_version"] = torch.version.cuda
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    env["gpu"] = {"name": p.name, "sms": p.multi_processor_count,
                  "memory_GiB": round(p.total_memory / 2**30, 1)}
json.dump(env, open(sys.argv[1], "w"), indent=2)
print(json.dumps(env, indent=2))
PYEOF

TEST_FILES=(tests/test_gpu_kernels.py tests/test_gpu_backends.py tests/test_gpu_graphs.py)
# -o addopts= drops the project's notebook options (nbval) that a bare GPU image may lack.
PYTEST_ARGS=(-m gpu -o addopts= -p no:cacheprovider -q -rs --junitxml="$REPORT_DIR/gpu_tests.xml")
# benchmarks/cpu_headlines.py's ShareGPT-like row: 7 reservations of max_model_len = 448 blocks of 4
PVC_ARGS=(--workload sharegpt --compare contiguous --block-size 4 --num-kv-blocks 448 --max-num-seqs 256
          --no-progress)
if [ "$DRY" = 1 ]; then
    export TRITON_INTERPRET=1
    timeout 120 "$PY" -m pytest "${PYTEST_ARGS[@]}" --collect-only "${TEST_FILES[@]}" \
        >"$REPORT_DIR/gpu_tests.log" 2>&1
    TEST_RC=$?
    timeout 120 "$PY" benchmarks/kernel_bench.py --dry-run --out "$REPORT_DIR/kernel_bench.json" \
        >"$REPORT_DIR/kernel_bench.log" 2>&1
    BENCH_RC=$?
    timeout 120 "$PY" benchmarks/gpu_serving.py --dry-run --out "$REPORT_DIR/serving.json" \
        >"$REPORT_DIR/serving.log" 2>&1
    SERVE_RC=$?
    timeout 120 "$PY" benchmarks/gpu_graphs.py --dry-run --out "$REPORT_DIR/graphs.json" \
        >"$REPORT_DIR/graphs.log" 2>&1
    GRAPH_RC=$?
    timeout 120 "$PY" benchmarks/spec_decode.py --device cpu --repeats 1 --num-requests 1 \
        --max-tokens 8 --workloads text --methods ngram --out "$REPORT_DIR/spec.json" \
        >"$REPORT_DIR/spec.log" 2>&1
    SPEC_RC=$?
    timeout 120 "$PY" -m minirunner bench --device cpu "${PVC_ARGS[@]}" --num-requests 8 \
        --json "$REPORT_DIR/paged_vs_contiguous.json" >"$REPORT_DIR/paged_vs_contiguous.log" 2>&1
    PVC_RC=$?
    timeout 120 "$PY" -m pytest "${PYTEST_ARGS[@]}" --collect-only tests/test_gpu_tensor_parallel.py \
        >"$REPORT_DIR/tensor_parallel.log" 2>&1
    TP_RC=$?
else
    # Per-block limits: 30 (environment: importing torch, triton and transformers took 10 s on an H200
    # machine) + 120 + 20 + 60 + 40 + 30 + 30 + 15 = 345 s.
    timeout 120 "$PY" -m pytest "${PYTEST_ARGS[@]}" "${TEST_FILES[@]}" \
        >"$REPORT_DIR/gpu_tests.log" 2>&1
    TEST_RC=$?
    timeout 20 "$PY" benchmarks/kernel_bench.py --reps 10 --out "$REPORT_DIR/kernel_bench.json" \
        >"$REPORT_DIR/kernel_bench.log" 2>&1
    BENCH_RC=$?
    timeout 60 "$PY" benchmarks/gpu_serving.py --num-seqs 128 --hf-num-seqs 4 --out "$REPORT_DIR/serving.json" \
        >"$REPORT_DIR/serving.log" 2>&1
    SERVE_RC=$?
    timeout 40 "$PY" benchmarks/gpu_graphs.py --steps 20 --out "$REPORT_DIR/graphs.json" \
        >"$REPORT_DIR/graphs.log" 2>&1
    GRAPH_RC=$?
    # speculative decoding at batch 1 under CUDA graphs (draft model, the embedded pair) vs plain, and
    # scheduled ahead (async_scheduling) vs the synchronous speculative run
    timeout 30 "$PY" benchmarks/spec_decode.py --device cuda --graph-mode cuda --repeats 1 \
        --num-requests 2 --max-tokens 32 --workloads text --methods draft_model --async-scheduling \
        --out "$REPORT_DIR/spec.json" >"$REPORT_DIR/spec.log" 2>&1
    SPEC_RC=$?
    # paged vs contiguous KV at equal memory on the ShareGPT-like workload (the CPU headline's settings)
    timeout 30 "$PY" -m minirunner bench --device cuda "${PVC_ARGS[@]}" --num-requests 100 \
        --json "$REPORT_DIR/paged_vs_contiguous.json" >"$REPORT_DIR/paged_vs_contiguous.log" 2>&1
    PVC_RC=$?
    # tensor parallelism: LLM(tensor_parallel_size=2) over NCCL equals one GPU; needs two GPUs (on one,
    # pytest reports it skipped with the reason, printed below)
    timeout 15 "$PY" -m pytest "${PYTEST_ARGS[@]/gpu_tests.xml/tensor_parallel.xml}" \
        tests/test_gpu_tensor_parallel.py >"$REPORT_DIR/tensor_parallel.log" 2>&1
    TP_RC=$?
fi
tail -n 25 "$REPORT_DIR/gpu_tests.log"
tail -n 5 "$REPORT_DIR/kernel_bench.log"
tail -n 3 "$REPORT_DIR/serving.log"
tail -n 6 "$REPORT_DIR/graphs.log"
grep -- "^->" "$REPORT_DIR/spec.log"
tail -n 12 "$REPORT_DIR/paged_vs_contiguous.log"
grep -E "SKIPPED|passed|failed|error" "$REPORT_DIR/tensor_parallel.log" | sed 's/^/tensor parallel: /'

"$PY" - "$REPORT_DIR" "$TEST_RC" "$BENCH_RC" "$DRY" "$(( $(date +%s) - T0 ))" "$SERVE_RC" "$GRAPH_RC" "$SPEC_RC" "$PVC_RC" "$TP_RC" <<'PYEOF'
import json, sys
from pathlib import Path
out, test_rc, bench_rc, dry, wall = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
serve_rc, graph_rc, spec_rc, pvc_rc, tp_rc = (int(a) for a in sys.argv[6:11])
def load(name):
    p = out / name
    try:
        return json.loads(p.read_text())
    except Exception as e:
        return {"missing": f"{name}: {type(e).__name__}: {e}"}
log = (out / "gpu_tests.log").read_text(errors="replace").splitlines() if (out / "gpu_tests.log").exists() else []
env = load("env.json")
report = {
    "mode": "dry-run" if dry else "gpu",
    "env": env,
    "gpu_tests": {"rc": test_rc, "timed_out": test_rc == 124, "summary": log[-1] if log else "",
                  "skipped_reasons": [l for l in log if l.startswith("SKIPPED")]},
    "kernel_bench": {"rc": bench_rc, "timed_out": bench_rc == 124, **load("kernel_bench.json")},
    "serving": {"rc": serve_rc, "timed_out": serve_rc == 124, **load("serving.json")},
    "graphs": {"rc": graph_rc, "timed_out": graph_rc == 124, **load("graphs.json")},
    "spec_decode": {"rc": spec_rc, "timed_out": spec_rc == 124, **load("spec.json")},
    "paged_vs_contiguous": {"rc": pvc_rc, "timed_out": pvc_rc == 124, **load("paged_vs_contiguous.json")},
    "tensor_parallel": {"rc": tp_rc, "timed_out": tp_rc == 124,
                        "log": [l for l in ((out / "tensor_parallel.log").read_text(errors="replace").splitlines()
                                            if (out / "tensor_parallel.log").exists() else [])
                                if l.startswith(("SKIPPED", "FAILED")) or " passed" in l or " failed" in l]},
    "flashinfer": ("available " + str(env.get("flashinfer"))) if not str(env.get("flashinfer", "unavailable")).startswith("unavailable")
                  else "unavailable on this machine (import flashinfer failed); FlashInfer tests skipped",
    "wall_s": wall,
}
(out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
print(f"gpu_check: tests rc={test_rc}, bench rc={bench_rc}, serving rc={serve_rc}, graphs rc={graph_rc}, "
      f"spec rc={spec_rc}, paged-vs-contiguous rc={pvc_rc}, tensor-parallel rc={tp_rc}, "
      f"{wall} s -> "
      f"{out / 'gpu_check.json'}")
PYEOF
# One results file for every GPU cell of the course (schema and loader: simulators/gpu_results.py): the
# report folder's figures with the machine, versions, commit and command. A dry run writes none.
if [ "$DRY" = 0 ]; then
    COMMIT="${GPU_CHECK_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "unknown (no git checkout)")}"
    if "$PY" -m simulators.gpu_results collect "$REPORT_DIR" --out "$REPORT_DIR/gpu_run.json" \
        --command "scripts/gpu_check.sh" --commit "$COMMIT" --date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"; then
        cp "$REPORT_DIR/gpu_run.json" "$ROOT/benchmarks/results/gpu_run.json"
        echo "gpu_check: results for the notebooks -> benchmarks/results/gpu_run.json (commit it)"
    fi
fi
if [ "$TEST_RC" -ne 0 ] || [ "$BENCH_RC" -ne 0 ] || [ "$SERVE_RC" -ne 0 ] || [ "$GRAPH_RC" -ne 0 ] \
    || [ "$SPEC_RC" -ne 0 ] || [ "$PVC_RC" -ne 0 ] || [ "$TP_RC" -ne 0 ]; then
    exit 1
fi
exit 0

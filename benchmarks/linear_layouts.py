"""CPU projections by row count: ``x @ w_t`` on a contiguous [in, out] copy against ``F.linear`` on
nn.Linear's [out, in] weight, for the embedded model's four projections of a layer, with the weights read
from memory as in a step (many copies cycled, so none stays in cache). The figures behind
``minirunner.model.decoder.FusedLinear``'s choice (one row: [in, out]; more: F.linear).

    python benchmarks/linear_layouts.py --threads 2 --out benchmarks/results/linear_layouts_cpu.json

Both layouts run interleaved, row count by row count; medians of the repeats, microseconds per layer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from minirunner.assets import default_model_dir
from minirunner.config import ModelConfig
from minirunner.tools.bench import environment


def layer_shapes(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(in, out) of the fused qkv, o, fused gate/up and down projections."""
    qkv = (cfg.num_q_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    return [(cfg.hidden_size, qkv), (cfg.num_q_heads * cfg.head_dim, cfg.hidden_size),
            (cfg.hidden_size, 2 * cfg.intermediate_size), (cfg.intermediate_size, cfg.hidden_size)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 24, 48])
    ap.add_argument("--copies", type=int, default=12, help="layers' worth of weights cycled")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--out", default="benchmarks/results/linear_layouts_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = layer_shapes(ModelConfig.from_dir(default_model_dir()))
    out_in = [[torch.randn(n, k) for k, n in shapes] for _ in range(args.copies)]
    in_out = [[w.t().contiguous() for w in layer] for layer in out_in]
    results = {}
    for rows in args.rows:
        xs = [torch.randn(rows, k) for k, _ in shapes]
        ways = {"x @ w_t, [in, out]": lambda xs=xs: [x @ w for layer in in_out
                                                      for x, w in zip(xs, layer, strict=True)],
                "F.linear, [out, in]": lambda xs=xs: [F.linear(x, w) for layer in out_in
                                                      for x, w in zip(xs, layer, strict=True)]}
        times = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, run in ways.items():
                t0 = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - t0) / args.copies * 1e6)
        results[rows] = {name: statistics.median(v[2:]) for name, v in times.items()}
        print(f"{rows:3d} rows: " + "   ".join(f"{name} {us:7.1f} us/layer"
                                               for name, us in results[rows].items()), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(environment=environment(), threads=args.threads,
                                              shapes=shapes, us_per_layer=results), indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Feasibility probe for graph_mode="compile": torch.compile(dynamic=False) of one decode forward on a CPU.

Owns one measurement for the staged-runner design: the embedded model's forward + logits + greedy pick
at a fixed batch, eager against compiled, timed side by side in interleaved rounds. The compiled
function needs attention without host syncs, so the probe carries a minimal vectorised decode backend
(one gather of the padded block table, one masked SDPA); it is not the runner's backend and serves
nothing. Usage: ``python benchmarks/compile_probe.py --threads 1 --num-kv-blocks 16``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from minirunner import LLM, SamplingParams
from minirunner.attention.base import AttentionBackend


class ProbeDecodeBackend(AttentionBackend):
    """Decode-only attention with no host sync: write K/V by slot, gather every block of the padded
    table, mask positions at or beyond seq_len, one SDPA call with GQA."""

    name = "probe"

    def forward(self, q, k, v, kv_cache, meta):
        bs = kv_cache.shape[2]
        slots = meta.slot_mapping
        kv_cache[slots // bs, 0, slots % bs] = k
        kv_cache[slots // bs, 1, slots % bs] = v
        tables = meta.block_tables.long()
        keys = kv_cache[tables, 0].flatten(1, 2).transpose(1, 2)    # [S, Hkv, L, D]
        values = kv_cache[tables, 1].flatten(1, 2).transpose(1, 2)
        mask = torch.arange(keys.shape[2])[None, :] < meta.seq_lens[:, None]
        out = F.scaled_dot_product_attention(q[:, :, None, :], keys, values,
                                             attn_mask=mask[:, None, None, :], scale=self.scale,
                                             enable_gqa=True)
        return out[:, :, 0, :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="KV pool size (default: the engine's CPU default)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(device="cpu", attention_backend="torch", max_model_len=128,
              num_kv_blocks=args.num_kv_blocks, num_threads=args.threads)
    engine, runner = llm.engine, llm.engine.runner
    b = runner.backend
    probe = ProbeDecodeBackend(b.num_q_heads, b.num_kv_heads, b.head_dim, b.scale, b.block_size,
                               b.device, b.dtype)
    for i in range(args.batch_size):
        engine.add_request([(i + j) % 1000 + 1 for j in range(16)],
                           SamplingParams(max_tokens=100, ignore_eos=True))
    for _ in range(3):
        engine.step()
    sched = engine.scheduler.schedule().output
    runner.update_states(sched)
    inputs = runner.prepare_inputs(sched)
    ids, meta = inputs.input_ids, inputs.meta
    runner.backend.plan(meta)

    def step_with(backend):
        def step(ids):
            hidden = runner.model(ids, meta, runner.kv_caches, backend)
            return runner.model.compute_logits(hidden).argmax(-1)
        return step

    def bench(fn, n=50):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(ids)
        return (time.perf_counter() - t0) / n

    with torch.inference_mode():
        reference = step_with(runner.backend)(ids)
        assert torch.equal(step_with(probe)(ids), reference)
        t0 = time.perf_counter()
        compiled = torch.compile(step_with(probe), dynamic=False)
        assert torch.equal(compiled(ids), reference)
        print(f"compile time {time.perf_counter() - t0:.1f} s")
        fns = {"eager, torch backend": step_with(runner.backend), "eager, probe backend": step_with(probe),
               "compiled, probe backend": compiled}
        for fn in fns.values():
            bench(fn, 10)
        samples = {k: [] for k in fns}
        for _ in range(args.rounds):  # interleaved, so every variant sees the same load
            for k, fn in fns.items():
                samples[k].append(bench(fn))
    med = {k: statistics.median(v) for k, v in samples.items()}
    for k, v in med.items():
        print(f"{k:26s} {v * 1e6:9.1f} µs (median of {args.rounds} rounds)")
    fast = med["compiled, probe backend"]
    print(f"threads {args.threads}, kv blocks {runner.kv_caches[0].shape[0]}, batch {args.batch_size}: "
          f"compiled / eager (probe) {med['eager, probe backend'] / fast:.2f}x, "
          f"compiled / eager (torch backend) {med['eager, torch backend'] / fast:.2f}x")


if __name__ == "__main__":
    main()

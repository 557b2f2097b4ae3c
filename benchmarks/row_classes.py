"""Which of a row's results change with the batch on this CPU: the measurements behind batch-invariant mode.

1. Linear layers: for each weight shape (the embedded model's and some larger), the row counts M
   (1..40, then up to 513) grouped into classes within which row 0 of ``x[:M] @ W.T`` has the same
   bits, for ``F.linear`` (MKL), MKL on a contiguous [in, out] copy (``x @ W_t``, the default's one-row
   path) and oneDNN's packed linear (``minirunner.model.cpu_linear``).
2. RMSNorm and log-softmax: whether rows of a call of M rows equal the same rows of a 3000-row call.
3. Attention: one query row (a sequence's last token, 77 keys) through each path the torch backend
   takes (decode SDPA alone or beside longer and shorter sequences; prefill SDPA over the whole prompt,
   the last chunk of a chunked prefill, a verify step's 4 rows), the C decode kernel (alone and in a
   batch) and the torch twins; the classes of bit-identical outputs.

    python benchmarks/row_classes.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from minirunner.attention.torch_ops import gather_rows, paged_decode_vectorized, paged_prefill_vectorized
from minirunner.kernels import paged_decode_cpu as ck
from minirunner.kernels.paged_attention_ref import paged_decode_ref, paged_prefill_ref
from minirunner.model import cpu_linear

SHAPES = [(256, 768), (256, 256), (256, 1536), (768, 256), (256, 1024), (1536, 256), (2048, 512),
          (4096, 1024), (896, 4864)]
ROWS = list(range(1, 41)) + [47, 63, 64, 65, 100, 128, 129, 200, 256, 300, 513]


def classes(outputs: dict) -> list[list]:
    groups: list[list] = []
    for key, value in outputs.items():
        for g in groups:
            if torch.equal(outputs[g[0]], value):
                g.append(key)
                break
        else:
            groups.append([key])
    return groups


def _ranges(groups) -> str:
    return " | ".join(f"{g[0]}..{g[-1]}" if len(g) > 1 else f"{g[0]}" for g in groups)


def linear_classes() -> None:
    torch.manual_seed(0)
    for k, n in SHAPES:
        w, x = torch.randn(n, k), torch.randn(max(ROWS), k)
        packed, w_t = cpu_linear.pack(w), w.t().contiguous()
        kernels = {"F.linear": lambda a: F.linear(a, w), "x @ W_t": lambda a: a @ w_t,  # noqa: B023
                   "oneDNN packed": lambda a: cpu_linear.packed_linear(a, packed, None, n)}  # noqa: B023
        for name, fn in kernels.items():
            groups = classes({m: fn(x[:m])[0] for m in ROWS})
            print(f"K={k:5d} N={n:5d} {name:14s} {len(groups)} classes of M: {_ranges(groups)}")


def row_ops() -> None:
    torch.manual_seed(0)
    for dim in (64, 256, 4096):
        x, w = torch.randn(3000, dim), torch.randn(dim)
        full, lsm = F.rms_norm(x, (dim,), w, 1e-6), torch.log_softmax(x, -1)
        ms = (1, 2, 3, 5, 8, 17, 64, 300, 1000)
        bad_norm = [m for m in ms if not torch.equal(F.rms_norm(x[:m], (dim,), w, 1e-6), full[:m])]
        bad_lsm = [m for m in ms if not torch.equal(torch.log_softmax(x[:m], -1), lsm[:m])]
        print(f"dim {dim:5d}: rms_norm rows differ at M={bad_norm}; log_softmax at M={bad_lsm}")


def attention_paths() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        have_kernel = ck.load(Path(folder))
    bs, hq, hkv, d, nb, length = 16, 4, 2, 64, 64, 77
    kv = torch.randn(nb + 1, 2, bs, hkv, d)
    tables = torch.arange(nb, dtype=torch.int32).view(8, 8)
    q_all, scale = torch.randn(8, length, hq, d), d ** -0.5

    def decode_sdpa(nseq, other_len):
        lens = torch.tensor([length] + [other_len] * (nseq - 1), dtype=torch.int32)
        q = q_all[:nseq, length - 1]
        cols = -(-int(lens.max()) // bs)
        mask = (torch.arange(cols * bs)[None, :] < lens[:, None])[:, None, None, :]
        return paged_decode_vectorized(q, kv, gather_rows(tables[:nseq, :cols], bs), mask, None, scale)[0]

    def prefill_sdpa(qlen):
        cols = -(-length // bs)
        allowed = torch.arange(cols * bs)[None, :] <= torch.arange(length - qlen, length)[:, None]
        mask = allowed.repeat_interleave(hq // hkv, dim=0)[None, None]
        rows = gather_rows(tables[:1, :cols], bs)
        return paged_prefill_vectorized(q_all[0, length - qlen:][None], kv, rows, mask, scale)[0, -1]

    one = torch.tensor([length], dtype=torch.int32)
    out = {"decode SDPA alone": decode_sdpa(1, length),
           "decode SDPA + 3 longer": decode_sdpa(4, 120),
           "decode SDPA + 7 shorter": decode_sdpa(8, 20),
           "prefill SDPA, whole prompt": prefill_sdpa(length),
           "prefill SDPA, last chunk of 13": prefill_sdpa(13),
           "verify SDPA, 4 rows": prefill_sdpa(4),
           "decode twin (paged_decode_ref)": paged_decode_ref(q_all[0, -1:], kv, tables[:1], one, scale)[0],
           "prefill twin (paged_prefill_ref)": paged_prefill_ref(
               q_all[0], kv, tables[:1], torch.tensor([0, length], dtype=torch.int32), one, scale)[-1]}
    if have_kernel:
        out["C kernel alone"] = ck.paged_decode_cpu(q_all[0, -1:], kv, tables[:1], one, scale)[0]
        lens = torch.tensor([length] + [100] * 7, dtype=torch.int32)
        out["C kernel + 7 others"] = ck.paged_decode_cpu(q_all[:, -1], kv, tables, lens, scale)[0]
    print("attention: classes of bit-identical outputs for one query row")
    for g in classes(out):
        print("  ", " = ".join(g))


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    linear_classes()
    row_ops()
    attention_paths()

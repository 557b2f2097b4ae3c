"""Notebook 08's exercises, implement-its and written homework: the split-KV merge by hand (compute), what
another reduction order does to the bits (predict), why the 2023 kernel lost in a given regime (explain);
the online softmax over chunks, the log-sum-exp merge and a paged read with GQA grouping as implement-its;
two "run, vary, explain" questions whose rubric stays with the instructor.

Owns the seeded questions, the checkers (each grades the property: agreement with the runner's twin, a
state of fixed size, no overflow, one read per block per KV head) and the rubric. Pure numpy: the runner's
twin comes in as a function argument, as in ``simulators.rejection``. Hints wait for a wrong attempt.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simulators.attention import PagedKV, split_partials
from simulators.exercises import Exercise, Verdict, choice_exercise, parse_float
from simulators.hinted_exercises import HintedExercise, HintedTask, hinted

__all__ = ["make_merge_exercise", "make_order_exercise", "make_regime_exercise", "online_softmax_task",
           "merge_task", "paged_gqa_task", "written_question", "WRITTEN", "instructor_rubric"]


# ---------------------------------------------------------------------------------------------
# Compute: merge two splits by hand

def make_merge_exercise(seed: int) -> HintedExercise:
    """Two splits of one head's keys (head_dim 1): their outputs o1, o2 and log-sum-exps; the merged
    output is (e^lse1 o1 + e^lse2 o2) / (e^lse1 + e^lse2)."""
    rng = random.Random(seed)
    o1, o2 = round(rng.uniform(-2, 2), 2), round(rng.uniform(-2, 2), 2)
    while abs(o1 - o2) < 0.5:
        o2 = round(rng.uniform(-2, 2), 2)
    lse1 = round(rng.uniform(0.5, 4), 1)
    lse2 = round(lse1 + rng.choice([-1, 1]) * rng.uniform(0.7, 2.0), 1)
    w1, w2 = math.exp(lse1), math.exp(lse2)
    answer = round((w1 * o1 + w2 * o2) / (w1 + w2), 3)
    question = (f"Split-KV cut one head's keys in two. Split 1 returned output o1 = {o1} and log-sum-exp of "
                f"its scores lse1 = {lse1};\nsplit 2 returned o2 = {o2}, lse2 = {lse2} (head_dim 1).\n"
                "What is the attention output over all the keys? (a number, 3 decimals)")

    def diagnose(ans) -> Verdict:
        x = parse_float(ans)
        if x is None:
            return Verdict(False, "answer with a number.")
        if abs(x - answer) < 0.006:
            return Verdict(True, f"weights e^lse1 : e^lse2, normalised: {answer}.")
        if abs(x - (o1 + o2) / 2) < 0.006:
            return Verdict(False, "that is the plain mean; a split holding more of the softmax's mass must "
                                  "weigh more")
        if abs(x - (lse1 * o1 + lse2 * o2) / (lse1 + lse2)) < 0.006:
            return Verdict(False, "that weighs by lse itself; lse is a logarithm of the split's mass")
        if abs(x - (w1 * o1 + w2 * o2)) < 0.006 * max(1.0, abs(w1 * o1 + w2 * o2)):
            return Verdict(False, "the weights must add up to 1")
        return Verdict(False, "each o_i is already normalised over its own keys; weigh it by its share of "
                              "the total mass")

    return hinted(Exercise(seed, question, answer, diagnose,
                           hint="split i's share of the mass is e^lse_i / (e^lse1 + e^lse2); subtract the "
                                "larger lse before exponentiating if the numbers are large."))


# ---------------------------------------------------------------------------------------------
# Predict and explain: options of equal weight, each "<what>: <why>", each wrong one a real misconception

_ORDERS = [
    ("the C kernel's online softmax over 64-key chunks is rerun on the same float32 inputs with 16-key "
     "chunks"),
    ("the Triton decode kernel runs the same batch with num_splits=4 instead of 1 (four partial results, "
     "then a log-sum-exp merge)"),
    "the same online softmax runs over 128-key chunks instead of 32-key chunks, float32 throughout",
]
_ORDER_OPTIONS = (
    ("different bits, within about 1e-6: the sums run in another order and every float add rounds",
     "floating-point addition is not associative: the same terms summed in another order round differently, "
     "at the level of float32's 1e-7 relative precision"),
    [("the same bits: the online softmax is exact algebra, so every chunking gives equal floats",
      "the algebra is exact over real numbers; in floats each rescale and each partial sum rounds, and a "
      "different cut rounds at different places"),
     ("an error near 1%: the smaller chunks see a smaller max, so exp loses precision there",
      "every term is rescaled to the final running max, so no term loses more than rounding; the "
      "difference stays near float32's 1e-7")],
)

_REGIMES = {
    "parallel": ("vLLM's 2023 kernel (v1) runs one thread block per (sequence, query head). A request at "
                 "batch 1 with 32 query heads and a 32K-token context decodes on a 132-SM H100. What "
                 "limits the step?",
                 ("idle SMs: 32 blocks for 132 SMs, each block walking 32K keys alone",
                  "the grid has batch x heads = 32 programs; splitting the keys (split-KV, v2's partitions) "
                  "gives the other SMs work, and a merge puts the parts together"),
                 [("KV bytes: 32K tokens of KV no longer fit in HBM and spill to the host",
                   "32K tokens of one request's KV are a few GB at most; capacity is not the limit here"),
                  ("launches: 32 separate kernels, one per head, each costing 5 us to start",
                   "it is one launch whose grid holds 32 blocks; the blocks, not launches, are too few")]),
    "gqa": ("vLLM's 2023 kernel runs one thread block per (sequence, query head). A GQA model has 32 "
            "query heads sharing 8 KV heads; batch 64, 4K-token contexts on an H200. What limits the step?",
            ("KV re-reads: each KV head is read by 4 blocks, one per query head of its group",
             "every block of a group streams the same K and V; a grouped kernel reads them once per KV head "
             "and uses them for all 4 query heads (4x fewer bytes)"),
            [("idle SMs: 64 x 32 = 2048 blocks leave most of the 132 SMs with no work",
              "2048 blocks are about 15 per SM: the grid is large, parallelism is not the problem here"),
             ("capacity: 64 requests of 4K tokens overflow the H200's 141 GB of HBM",
              "64 x 4K tokens at 160 KiB a token (40 layers, 8 KV heads of 128, bf16) are 40 GiB; "
              "they fit")]),
    "tensor_cores": ("A decode step of a GQA model with 8 query heads per KV head. The 2023 kernel computes "
                     "each query head's scores as dot products on ordinary CUDA cores. What do the newer "
                     "kernels gain by grouping?",
                     ("a matrix: 8 query rows share each K tile, so the scores are a tensor-core product",
                      "one query token is a vector, but the group's 8 rows against a tile of keys form an "
                      "[8 x tile] product that tensor cores compute (FlashInfer's use_tensor_cores)"),
                     [("fewer launches: the 8 query heads of a group are fused into one kernel call",
                       "the 2023 kernel is already one launch for all heads; the gain is in how each "
                       "block computes, not in launches"),
                      ("less capacity: grouping lets 8 query heads share one copy of the KV in memory",
                       "GQA's one KV copy per group is the model's design; any kernel stores it once, the "
                       "2023 kernel too")]),
}


def make_order_exercise(seed: int) -> HintedExercise:
    """Predict: the same softmax in another reduction order; what happens to the output's bits?"""
    rng = random.Random(seed)
    change = rng.choice(_ORDERS)
    right, wrongs = _ORDER_OPTIONS
    question = (f"Predict, before the next cell measures it: {change}. Compared with the first run's output, "
                "what do you expect?")
    return hinted(choice_exercise(seed, rng, question, right, list(wrongs),
                                  hint="ask what a float32 add does with the order of its terms."))


def make_regime_exercise(seed: int) -> HintedExercise:
    """Explain: why the 2023 kernel loses in one regime (parallelism, GQA re-reads, no tensor cores)."""
    rng = random.Random(seed)
    question, right, wrongs = _REGIMES[rng.choice(sorted(_REGIMES))]
    hint = "count the thread blocks and what each one reads, and compare with the GPU's SMs and bytes."
    return hinted(choice_exercise(seed, rng, question, right, wrongs, hint=hint))


# ---------------------------------------------------------------------------------------------
# Implement-its. A reference (the runner's twin, wrapped) is handed in; cases are seeded.

def _attention_case(rng: np.random.Generator, length: int, d: int, scores: np.ndarray | None = None) -> dict:
    """q, k, v of one head; with ``scores`` given, q is a unit vector and k's first column holds them, so
    the scores are exactly those numbers (scale 1)."""
    k = rng.standard_normal((length, d))
    v = rng.standard_normal((length, d))
    if scores is None:
        q = rng.standard_normal(d)
        return dict(q=q, k=k, v=v, scale=1 / math.sqrt(d))
    q = np.zeros(d)
    q[0] = 1.0
    k[:, 0] = scores
    return dict(q=q, k=k, v=v, scale=1.0)


def _close(got, want, rtol=1e-4, atol=1e-5) -> bool:
    got = np.asarray(got, dtype=np.float64)
    return got.shape == np.shape(want) and bool(np.all(np.isfinite(got))) and \
        bool(np.allclose(got, want, rtol=rtol, atol=atol))


def _fmt(x) -> str:
    return repr(np.round(np.asarray(x, dtype=np.float64), 4).tolist())


@dataclass
class OnlineSoftmaxTask:
    """Check ``update(state, q, k_chunk, v_chunk, scale) -> (m, l, acc)``: called chunk after chunk
    (``state`` is None before the first), it must keep a state of fixed size (a number m, a number l,
    acc of head_dim values) from which the output so far is acc / l. After every chunk that output must
    equal the twin's attention over the keys seen so far, with every value finite."""

    reference: Callable = field(repr=False)  # (q [D], k [L, D], v [L, D], scale) -> out [D]
    seed: int = 0
    hint: str = ("keep m, the largest score so far (start from -inf), l = sum of exp(score - m) and acc = "
                 "sum of exp(score - m) * v; when a chunk raises the max to m_new, multiply l and acc by "
                 "exp(m - m_new) before adding the chunk's exp(s - m_new) terms.")

    def cases(self) -> list[dict]:
        rng = np.random.default_rng(self.seed)
        d = 6
        out = [dict(_attention_case(rng, 40, d), chunk=8, what="random scores"),
               dict(_attention_case(rng, 36, d, np.linspace(-3, 9, 36) + rng.normal(0, .3, 36)), chunk=8,
                    what="scores rising chunk by chunk"),
               dict(_attention_case(rng, 24, d, np.r_[rng.normal(400, 1, 8), rng.normal(-400, 1, 16)]),
                    chunk=8, what="a peaked head: scores near +400, then near -400"),
               dict(_attention_case(rng, 20, d, rng.normal(-900, 2, 20)), chunk=6,
                    what="every score near -900"),
               dict(_attention_case(rng, 13, d), chunk=1, what="one key at a time")]
        return out

    def check(self, update: Callable) -> Verdict:
        for i, case in enumerate(self.cases()):
            q, k, v, scale, chunk = case["q"], case["k"], case["v"], case["scale"], case["chunk"]
            state = None
            for n, t0 in enumerate(range(0, len(k), chunk)):
                try:
                    state = update(state, q.copy(), k[t0:t0 + chunk].copy(), v[t0:t0 + chunk].copy(), scale)
                except NotImplementedError:
                    return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
                except Exception as e:  # a student's bug is a verdict, not a crash
                    return Verdict(False, f"case {i} ({case['what']}), chunk {n}: raised "
                                          f"{type(e).__name__}: {e}")
                where = f"case {i} ({case['what']}, {len(k)} keys in chunks of {chunk}), after chunk {n}"
                try:
                    m, l_sum, acc = state
                    ok_shape = np.ndim(m) == 0 and np.ndim(l_sum) == 0 and np.shape(acc) == (len(q),)
                except (TypeError, ValueError):
                    ok_shape = False
                if not ok_shape:
                    return Verdict(False, f"{where}: the state must be (m, l, acc) with m and l numbers and "
                                          f"acc of {len(q)} values; a state that grows with the keys is "
                                          "not an online softmax")
                with np.errstate(all="ignore"):
                    got = np.asarray(acc, dtype=np.float64) / float(l_sum)
                want = self.reference(q, k[:t0 + chunk], v[:t0 + chunk], scale)
                if not _close(got, want):
                    bad = "not finite (an overflow or 0/0)" if not np.all(np.isfinite(got)) else _fmt(got)
                    return Verdict(False, f"{where}: acc / l = {bad}, the twin's attention over these keys "
                                          f"is {_fmt(want)}")
        return Verdict(True, f"acc / l equals the twin's attention after every chunk of all "
                             f"{len(self.cases())} cases, with a state of three fixed-size parts")


@dataclass
class MergeTask:
    """Check ``merge(parts) -> out``: ``parts`` is a list of (o_i [D], lse_i) from split-KV (each split's
    own normalised output and the log-sum-exp of its scores; an empty split is (zeros, -inf)); the merged
    output must equal the twin's attention over all the keys, finite."""

    reference: Callable = field(repr=False)
    seed: int = 0
    hint: str = ("split i holds e^lse_i of the softmax's total mass: out = sum_i w_i o_i with "
                 "w_i = exp(lse_i - M) / sum_j exp(lse_j - M), M the largest lse_i (so nothing overflows and "
                 "an empty split weighs 0).")

    def cases(self) -> list[dict]:
        rng = np.random.default_rng(self.seed + 1)
        d = 6
        return [dict(_attention_case(rng, 50, d), splits=2, what="two splits"),
                dict(_attention_case(rng, 47, d, rng.normal(0, 3, 47)), splits=5, what="five uneven splits"),
                dict(_attention_case(rng, 30, d, np.r_[rng.normal(800, 2, 10), rng.normal(790, 2, 20)]),
                     splits=3, what="scores near 800"),
                dict(_attention_case(rng, 3, d), splits=4, what="more splits than keys: one is empty")]

    def check(self, merge: Callable) -> Verdict:
        for i, case in enumerate(self.cases()):
            parts = split_partials(case["q"], case["k"], case["v"], case["scale"], case["splits"])
            want = self.reference(case["q"], case["k"], case["v"], case["scale"])
            try:
                with np.errstate(all="ignore"):
                    got = merge([(o.copy(), lse) for o, lse in parts])
            except NotImplementedError:
                return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
            except Exception as e:
                return Verdict(False, f"case {i} ({case['what']}): raised {type(e).__name__}: {e}")
            if not _close(got, want):
                lses = ", ".join(f"{lse:.2f}" for _, lse in parts)
                bad = "not finite (an overflow or 0/0)" if not np.all(np.isfinite(np.asarray(got, float))) \
                    else _fmt(got)
                return Verdict(False, f"case {i} ({case['what']}; lse = {lses}): merged {bad}, the twin over "
                                      f"all keys gives {_fmt(want)}")
        return Verdict(True, "the merge equals the twin's attention over all keys in all "
                             f"{len(self.cases())} cases")


@dataclass
class PagedGqaTask:
    """Check ``decode(q, kv, block_table, seq_len, scale) -> out``: one sequence's decode attention,
    q [num_q_heads, D] -> [num_q_heads, D], reading the cache only through ``kv.read(block, kv_head)``
    (a PagedKV) and the block table, each needed block once per KV head (the group of query heads sharing
    it uses one read). The output must equal the twin's, and the reads must be exactly
    blocks needed x num_kv_heads."""

    reference: Callable = field(repr=False)  # (q, cache, block_table, seq_len, scale) -> out
    seed: int = 0
    hint: str = ("query head h uses KV head h // (num_q_heads // num_kv_heads); token t lives in block "
                 "block_table[t // block_size] at row t % block_size; the sequence needs "
                 "ceil(seq_len / block_size) blocks and only its first seq_len tokens; read each block once "
                 "per KV head and use it for every query head of that group.")

    def cases(self) -> list[dict]:
        rng = np.random.default_rng(self.seed + 2)
        out = []
        for seq_len, hq, hkv, bs, what in ((11, 8, 2, 4, "8 query heads on 2 KV heads, a partial last block"),
                                           (12, 4, 4, 4, "no grouping, the last block full"),
                                           (9, 6, 2, 2, "groups of 3, blocks of 2"),
                                           (5, 8, 2, 8, "one partial block")):
            d, num_blocks = 4, 12
            cache = rng.standard_normal((num_blocks, 2, bs, hkv, d))
            cache[:, :, :, :, 0] += 4 * rng.standard_normal((num_blocks, 2, bs, hkv))  # stale rows matter
            need = -(-seq_len // bs)
            table = [int(b) for b in rng.permutation(num_blocks)[:need + 2]]  # two unused columns after
            q = rng.standard_normal((hq, d))
            out.append(dict(q=q, cache=cache, block_table=table, seq_len=seq_len, scale=1 / math.sqrt(d),
                            what=what))
        return out

    def check(self, decode: Callable) -> Verdict:
        for i, case in enumerate(self.cases()):
            kv = PagedKV(case["cache"])
            want = self.reference(case["q"], case["cache"], case["block_table"], case["seq_len"],
                                  case["scale"])
            try:
                got = decode(case["q"].copy(), kv, list(case["block_table"]), case["seq_len"], case["scale"])
            except NotImplementedError:
                return Verdict(False, "not implemented", answered=False, pending="not implemented yet")
            except Exception as e:
                return Verdict(False, f"case {i} ({case['what']}): raised {type(e).__name__}: {e}")
            where = (f"case {i} ({case['what']}: seq_len {case['seq_len']}, block_size {kv.block_size}, "
                     f"block table {case['block_table']})")
            if not _close(got, want):
                return Verdict(False, f"{where}: got {_fmt(got)}, the twin gives {_fmt(want)}")
            blocks = -(-case["seq_len"] // kv.block_size)
            if kv.reads != blocks * kv.num_kv_heads:
                return Verdict(False, f"{where}: right output with {kv.reads} reads; {blocks} blocks x "
                                      f"{kv.num_kv_heads} KV heads = {blocks * kv.num_kv_heads} are enough "
                                      "(one read per block per KV head, shared by its group)")
        return Verdict(True, f"the twin's output in all {len(self.cases())} cases, one read per block per "
                             "KV head")


def online_softmax_task(reference: Callable, seed: int = 0) -> HintedTask:
    """The online-softmax implement-it; ``reference(q, k, v, scale) -> out`` is the runner's twin for one
    head, wrapped."""
    return HintedTask(OnlineSoftmaxTask(reference, seed), name="online softmax")


def merge_task(reference: Callable, seed: int = 0) -> HintedTask:
    """The split-KV merge implement-it, against the twin over all keys."""
    return HintedTask(MergeTask(reference, seed), name="split-KV merge")


def paged_gqa_task(reference: Callable, seed: int = 0) -> HintedTask:
    """The paged read with GQA grouping implement-it; ``reference(q, cache, block_table, seq_len, scale)``
    is the runner's twin for one sequence, wrapped."""
    return HintedTask(PagedGqaTask(reference, seed), name="paged GQA decode")


# ---------------------------------------------------------------------------------------------
# Run, vary, explain (OSTEP-style homework). The notebook prints the prompt; the rubric is the instructor's.

WRITTEN = {
    "timing": ("Run section 5's sweep again with torch.set_num_threads(n) for every n up to your machine's "
               "cores (keep the C kernel on one thread). For each n, find the smallest batch x context at "
               "which the naive path beats the chunked kernel, or say that it never does. Explain what you "
               "see with the bytes model: which term (fixed cost per call, bytes / bandwidth) dominates each "
               "path on each side, and how n enters. What would a split-KV or multi-threaded chunked kernel "
               "change?"),
    "order": ("Run section 6's cell with chunk sizes 8, 16, 64 and 256 and with num_splits 1, 2, 3 and 8 on "
              "the Triton kernel (or its twin where Triton is absent). Which outputs are bit-identical to "
              "which? Which are within 1e-6? Explain why, then say what a batch-invariant mode must fix so "
              "that a request's output does not depend on the batch it lands in."),
}

_RUBRIC = {
    "timing": [
        "2 pts: a table of crossovers (or 'none') per thread count, measured, with medians and ranges",
        "2 pts: fixed cost dominates at small batch x context (one C call vs about eight torch ops); bytes "
        "dominate at large ones (the naive path moves ~3x the KV plus the score matrix)",
        "2 pts: threads divide only the naive path's bytes term; the crossover appears once n exceeds the "
        "bytes-bound ratio (about the measured naive / chunked ratio at one thread)",
        "2 pts: a split-KV or parallel chunked kernel would divide its own bytes term by n too, so the "
        "crossover moves away (v1 vs v2 / flash-decoding on a GPU: parallel work at batch 1)",
        "2 pts: names one thing the model leaves out (caches, the re-read per query head, the machine's "
        "load)",
    ],
    "order": [
        "3 pts: reports that runs with the same chunk size / split count are bit-identical, different ones "
        "differ in some bits but agree to ~1e-6",
        "3 pts: explains it by the non-associativity of float addition and the rescale rounding at each cut",
        "4 pts: a batch-invariant mode fixes the reduction order per request (split sizes and tile order "
        "independent of batch size and of what runs beside it), at some cost in parallel work",
    ],
}


def written_question(name: str) -> str:
    """The prompt of a "run, vary, explain" question (the rubric is not shown)."""
    return f"Run, vary, explain ({name}): {WRITTEN[name]}"


def instructor_rubric(name: str) -> list[str]:
    """The grading points of a written question, for the instructor's copy (the student release leaves
    this out)."""
    return list(_RUBRIC[name])

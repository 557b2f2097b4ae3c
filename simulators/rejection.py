"""The rejection rule of speculative decoding, small enough to check by hand, and its goodness of fit.

Owns the numpy side of notebook 06: the acceptance probability sum_x min(p(x), q(x)), the residual
max(0, p - q) a rejection resamples from, the exact law of the emitted token, a reference sampler for
one request's chain of k drafts with its random draws passed in, per-position acceptance (conditional
and unconditional) from a run's (k, accepted) records, a chi-square test, the seeded exercises and the
implement-it task. Pure numpy: never imports torch or the runner; the runner's twin comes in as a
function argument (``rejection_task``) and a run's records as plain data.

Letters follow Leviathan et al. 2023 (arXiv 2211.17192): p = target, q = draft.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import numpy as np

from simulators.exercises import Exercise, ImplementIt, Verdict, choice_exercise, parse_float
from simulators.hinted_exercises import HintedTask, hinted

__all__ = ["acceptance_probability", "residual", "emitted_distribution", "rejection_sample_chain",
           "acceptance_by_position", "chi2_sf", "chi_square", "make_acceptance_exercise",
           "make_histogram_exercise", "make_regime_exercise", "rejection_task"]


def acceptance_probability(p: np.ndarray, q: np.ndarray) -> np.ndarray | float:
    """beta = sum_x min(p(x), q(x)): the chance a draft x ~ q survives the test u < p(x) / q(x).
    p, q: [..., vocab]; returns [...] (a float for one pair)."""
    beta = np.minimum(np.asarray(p, float), np.asarray(q, float)).sum(-1)
    return float(beta) if np.ndim(beta) == 0 else beta


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)): where a rejected draft's replacement is drawn from. Its unnormalised mass
    is 1 - beta; p == q leaves none (a rejection then cannot happen), returned as zeros."""
    r = np.clip(np.asarray(p, float) - np.asarray(q, float), 0.0, None)
    mass = r.sum(-1, keepdims=True)
    return np.divide(r, mass, out=np.zeros_like(r), where=mass > 0)


def emitted_distribution(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The law of the token the rule emits at one position, in its two parts:
    accepted(y) = q(y) * min(1, p(y) / q(y)) = min(p(y), q(y)) and
    recovered(y) = P(reject) * residual(y) = (1 - beta) * max(0, p(y) - q(y)) / (1 - beta).
    Their sum is p(y) for every y: the proof that the rule is lossless, as arrays."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    accepted = np.minimum(p, q)
    recovered = (1.0 - accepted.sum(-1, keepdims=True)) * residual(p, q)
    return accepted, recovered


def rejection_sample_chain(p, q, draft, u, g, seed=None, position=None) -> list[int]:
    """One request's emitted tokens, with every random draw passed in (the reference solution).

    p: [k+1, vocab] the target's probabilities at the k draft positions and the bonus position;
    q: [k, vocab] the draft's; draft: [k] the drafted token ids; u: [k] uniforms, one per accept test;
    g: [k+1, vocab] Gumbel noise, row j for the token the target draws itself at position j.
    ``seed``/``position`` name where the runner draws u and g from; the rule does not need them.
    Draft j is accepted when p[j, x] >= u[j] * q[j, x] (u < p/q); the first rejected one is replaced by
    argmax(log max(0, p - q) + g) (a Gumbel-max draw from the residual) and the run ends; when all k
    pass, the bonus token argmax(log p[k] + g[k]) is a draw from p.
    """
    p, q, g = np.asarray(p, float), np.asarray(q, float), np.asarray(g, float)
    out: list[int] = []
    with np.errstate(divide="ignore"):
        for j, x in enumerate(np.asarray(draft).tolist()):
            if q[j, x] > 0 and p[j, x] >= u[j] * q[j, x]:
                out.append(int(x))
                continue
            r = np.clip(p[j] - q[j], 0.0, None)
            out.append(int(np.argmax(np.log(r) + g[j])))
            return out
        out.append(int(np.argmax(np.log(p[-1]) + g[-1])))
    return out


def acceptance_by_position(runs: Sequence[tuple[int, int]]) -> tuple[list[float], list[float]]:
    """Per draft position j, from a run's (k, accepted) records (one per verify step and request):

    unconditional[j] = P(draft j accepted) over steps that drafted a j-th token;
    conditional[j]   = P(draft j accepted | drafts 0..j-1 accepted), over steps that tested it.
    Unconditional rates can only fall with j (a later draft needs all before it); if every draft were
    accepted with the same alpha, independently, the conditional rates would all be alpha and the
    unconditional ones alpha^(j+1)."""
    k_max = max((k for k, _ in runs), default=0)
    unconditional, conditional = [], []
    for j in range(k_max):
        drafted = [(k, a) for k, a in runs if k > j]
        tested = [(k, a) for k, a in drafted if a >= j]
        accepted = sum(a > j for _, a in drafted)
        unconditional.append(accepted / len(drafted))
        conditional.append(accepted / len(tested) if tested else float("nan"))
    return unconditional, conditional


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square with ``dof`` degrees of freedom: the regularised upper incomplete
    gamma Q(dof/2, x/2), by its series below a+1 and its continued fraction above (Numerical Recipes)."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:  # lower series, P(a, z); Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1.0
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300  # Lentz's continued fraction for Q(a, z)
    b = z + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return min(1.0, math.exp(log_front) * h)


def chi_square(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> dict:
    """Pearson's goodness-of-fit test of ``counts`` (per token) against ``probs``.

    Tokens expected fewer than ``min_expected`` times are pooled into one bin (the test's usual rule).
    Returns statistic, dof (bins - 1), p_value and the bins used. A p-value below 0.001 says the
    counts were very unlikely to come from ``probs``."""
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    n = counts.sum()
    if n <= 0:
        raise ValueError("no samples to test")
    expected = n * probs / probs.sum()
    big = expected >= min_expected
    obs_bins = list(counts[big]) + ([counts[~big].sum()] if (~big).any() else [])
    exp_bins = list(expected[big]) + ([expected[~big].sum()] if (~big).any() else [])
    if exp_bins and exp_bins[-1] == 0:  # a pooled bin of impossible tokens: any count there is a failure
        if obs_bins[-1] > 0:
            return dict(statistic=math.inf, dof=len(obs_bins) - 2, p_value=0.0, bins=len(obs_bins))
        obs_bins, exp_bins = obs_bins[:-1], exp_bins[:-1]
    obs, exp = np.array(obs_bins), np.array(exp_bins)
    if len(obs) < 2:
        raise ValueError("fewer than two bins with enough expected samples: draw more")
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    return dict(statistic=stat, dof=dof, p_value=chi2_sf(stat, dof), bins=len(obs))


# ---------------------------------------------------------------------------------------------
# Exercises: compute (beta), predict (the histogram a kernel will draw), explain (the regime)

_TOKENS = "ABCD"


def _pair(rng: random.Random) -> tuple[list[float], list[float]]:
    """Two distributions over four tokens, in hundredths, that differ somewhere."""
    while True:
        cuts_p = sorted(rng.sample(range(1, 100), 3))
        cuts_q = sorted(rng.sample(range(1, 100), 3))
        p = [b - a for a, b in zip([0, *cuts_p], [*cuts_p, 100], strict=True)]
        q = [b - a for a, b in zip([0, *cuts_q], [*cuts_q, 100], strict=True)]
        if p != q and min(p) >= 3 and min(q) >= 3:
            return [x / 100 for x in p], [x / 100 for x in q]


def _show(dist: list[float]) -> str:
    return ", ".join(f"{t}: {x:.2f}" for t, x in zip(_TOKENS, dist, strict=True))


def make_acceptance_exercise(seed: int) -> Exercise:
    """Compute: the probability that one draft token is accepted, given p and q over four tokens."""
    rng = random.Random(seed)
    p, q = _pair(rng)
    beta = round(sum(min(a, b) for a, b in zip(p, q, strict=True)), 4)
    question = (f"Target p = {{{_show(p)}}}\nDraft  q = {{{_show(q)}}}\nThe draft samples x ~ q and the "
                "target accepts it with probability min(1, p(x)/q(x)).\nWhat is the probability that "
                "the draft token is accepted? (a number in [0, 1])")

    def diagnose(answer) -> Verdict:
        value = parse_float(answer)
        if value is None:
            return Verdict(False, "answer with a number in [0, 1].", attempt=False)
        if abs(value - beta) < 0.005:
            return Verdict(True, f"sum over x of q(x) * min(1, p(x)/q(x)) = sum of min(p, q) = {beta}.")
        dot = sum(a * b for a, b in zip(p, q, strict=True))
        if abs(value - dot) < 0.005:
            return Verdict(False, "sum of p * q is the chance that two independent draws agree; the test "
                                  "accepts x with min(1, p(x)/q(x)), not only when the target draws x too.")
        if abs(value - (1 - sum(abs(a - b) for a, b in zip(p, q, strict=True)))) < 0.005:
            return Verdict(False, "close: sum min(p, q) = 1 - (1/2) sum |p - q|; you forgot the 1/2.")
        if abs(value - sum(max(a, b) for a, b in zip(p, q, strict=True))) < 0.005:
            return Verdict(False, "that is sum max(p, q), which is at least 1; a probability of "
                                  "acceptance takes the smaller of the two.")
        return Verdict(False, "weight each token's acceptance min(1, p/q) by how often the draft "
                              "proposes it, q.")

    return Exercise(seed, question, beta, diagnose)


def make_histogram_exercise(seed: int) -> Exercise:
    """Predict: out of n runs of one position of the rule, how many emit a given token?"""
    rng = random.Random(seed)
    p, q = _pair(rng)
    n = rng.choice([1000, 2000, 5000, 10000])
    # a token the target wants more than the draft proposes it, so the rejections' share counts
    y = rng.choice([t for t in range(4) if p[t] - q[t] >= 0.02] or [max(range(4), key=lambda t: p[t] - q[t])])
    solution = round(n * p[y])
    question = (f"Target p = {{{_show(p)}}}\nDraft  q = {{{_show(q)}}}\nThe rule runs {n} times at one "
                "position: draft x ~ q, accept with min(1, p(x)/q(x)), else draw from norm(max(0, p - q)).\n"
                f"About how many of the {n} emitted tokens are {_TOKENS[y]}? (an expected count)")

    def diagnose(answer) -> Verdict:
        value = parse_float(answer)
        if value is None:
            return Verdict(False, "answer with a number (an expected count).", attempt=False)
        if abs(value - solution) <= 0.005 * n:
            return Verdict(True, f"n * p({_TOKENS[y]}) = {solution}: min(p, q) comes from accepted drafts, "
                                 "max(0, p - q) from rejections, and the two add up to p.")
        if abs(value - n * q[y]) <= 0.005 * n:
            return Verdict(False, "that is how often the draft proposes it; rejections move mass from "
                                  "where q > p to where p > q.")
        if abs(value - n * min(p[y], q[y])) <= 0.005 * n:
            return Verdict(False, "that counts accepted drafts only; a rejection emits a token too, drawn "
                                  "from max(0, p - q).")
        return Verdict(False, "add the accepted part min(p, q) and the recovered part max(0, p - q).")

    return Exercise(seed, question, solution, diagnose)


# Each regime: the question, the right option and two wrong ones, each a misconception students hold,
# each with the reason it is wrong (given only after that option is chosen). Options are of equal
# length and form ("<what>: <why>"), so none stands out.
_REGIMES = {
    "memory": ("A 70B-parameter model in bf16 serves one request on a GPU under CUDA graphs. Verifying "
               "k + 1 = 5 tokens takes about as long as decoding 1. What sets the step time?",
               ("weight reads: all 140 GB are read once per step, and 5 tokens reuse every byte read",
                "memory-bound: time = weight bytes / bandwidth, and k + 1 tokens reuse each byte read"),
               [("kernel launches: one pass over 5 tokens launches a fifth of the kernels of five",
                 "under CUDA graphs a step is one launch whatever it scores; launches are not the cost"),
                ("the draft's work: the drafted tokens were already computed, so the target only checks",
                 "the target recomputes every position with its own weights; no draft work is reused")]),
    "compute": ("A 70B-parameter model in bf16 serves 256 requests per step on GPUs. Verifying k + 1 = 5 "
                "tokens per request now costs about 5 decode steps. What sets the step time?",
                ("arithmetic: 1280 tokens per weight read is past the ridge of about 200 FLOPs a byte",
                 "compute-bound: time = FLOPs / peak, and the FLOPs grow with the tokens scored"),
                [("memory capacity: the KV of 1280 tokens no longer fits, so blocks swap to the host",
                  "1280 more tokens of KV is a few hundred MB; capacity does not change the step's time"),
                 ("the sampler: rejection sampling over 1280 rows of a 128K vocabulary takes over",
                  "sampling reads each row once; it is small next to 2 x 70B FLOPs per token")]),
    "overhead": ("The 3.2M-parameter embedded model runs eager on a CPU. Its 1-layer draft has a fifth of "
                 "the target's FLOPs but costs more than a fifth of a target step. What sets its "
                 "step time?",
                 ("host work: one layer still dispatches embedding, norms, attention, MLP, lm_head, sampler",
                  "overhead-bound: time = operators x host cost per operator, not FLOPs"),
                 [("weight reads: the draft's weights leave the CPU cache each step and come from DRAM",
                   "its 0.64M weights (a few MB) take microseconds even from DRAM; its step takes ms"),
                  ("KV reads: the draft's attention also reads the target's KV cache on every step",
                   "the draft has its own paged KV cache and reads only that, a quarter of the target's")]),
}


def make_regime_exercise(seed: int) -> Exercise:
    """Explain: which regime a step is in, and so what verifying k + 1 tokens costs. Answer a, b or c."""
    rng = random.Random(seed)
    name = rng.choice(sorted(_REGIMES))
    question, right, wrongs = _REGIMES[name]
    suffix = ("; ask which of weight bytes / bandwidth, FLOPs / peak or operators x host cost is the largest "
              "(notebook 04)")
    return choice_exercise(seed, rng, question, right, wrongs, wrong_suffix=suffix)


# ---------------------------------------------------------------------------------------------
# Implement-it: a student's rejection sampler for one request's chain, against the runner's twin


def _case(rng: np.random.Generator, k: int, vocab: int, closeness: float) -> dict:
    p = rng.dirichlet(np.full(vocab, 0.7), size=k + 1)
    noise = rng.dirichlet(np.full(vocab, 0.7), size=k)
    q = (1 - closeness) * noise + closeness * p[:k]
    draft = np.array([rng.choice(vocab, p=row / row.sum()) for row in q])
    return dict(p=p.astype(np.float32), q=q.astype(np.float32), draft=draft)


def rejection_task(reference: Callable[..., list[int]],
                   draw_noise: Callable[[int, int, int, int], tuple[np.ndarray, np.ndarray]],
                   vocab: int = 6, seed: int = 0) -> HintedTask:
    """The implement-it task: write ``fn(p, q, draft, u, g, seed, position) -> list[int]`` (the
    signature and meaning of :func:`rejection_sample_chain`) and match ``reference`` on seeded cases.

    ``reference`` is the runner's twin wrapped to that signature (it draws its own randomness from
    ``seed`` and ``position``); ``draw_noise(seed, position, k, vocab) -> (u [k], g [k+1, vocab])`` is the
    runner's noise for the same keys, handed to the student so both see the same draws. The cases cover
    a rejection of the first draft, a rejection later in the chain, and a chain accepted whole (bonus).
    """
    rng = np.random.default_rng(seed)
    cases: list[dict] = []
    kinds: dict[str, int] = {"first": 0, "later": 0, "bonus": 0}
    for i in range(400):
        k = int(rng.integers(1, 5))
        case = _case(rng, k, vocab, closeness=float(rng.choice([0.3, 0.8, 0.95])))
        case["seed"], case["position"] = 1000 * seed + i, int(rng.integers(0, 200))
        case["u"], case["g"] = draw_noise(case["seed"], case["position"], k, vocab)
        n = len(reference(**case))
        kind = "bonus" if n == k + 1 else ("first" if n == 1 else "later")
        if kinds[kind] < 3:
            kinds[kind] += 1
            cases.append(case)
        if len(cases) == 9:
            break
    if len(cases) < 9:
        raise RuntimeError(f"could not draw a case of every kind: {kinds}")

    def show(x) -> str:
        if isinstance(x, np.ndarray):
            return repr(np.round(x, 3).tolist())
        return repr(x)

    return hinted(ImplementIt("rejection_sampler", reference, cases,
                       same=lambda got, expected: [int(t) for t in got] == list(expected),
                       hint="walk the drafts in order: accept draft j when p[j, x] >= u[j] * q[j, x]; at "
                            "the first rejection append argmax(log(max(0, p[j] - q[j])) + g[j]) and stop; "
                            "if all pass, append argmax(log(p[k]) + g[k]).",
                       show=show))

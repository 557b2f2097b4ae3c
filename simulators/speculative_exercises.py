"""Notebook 06's implement-it on dynamic speculation: choose the next step's k from what a run measured.

Owns the seeded measurement histories and the checker of a student's dynamic-k chooser; the reference
rule (minirunner/spec_decode/dynamic.py, ``AcceptanceDrivenK``) comes in as a function argument, so this
module never imports the runner. Pure Python.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from simulators.exercises import ImplementIt
from simulators.hinted_exercises import HintedTask, hinted
from simulators.speculative import tokens_per_pass

KINDS = ("warmup", "probe", "zero", "interior", "max")


def _factor(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    return 1.0 if k == 0 else tokens_per_pass(alpha, k) / (k * c + v)


def _best(alpha: float, c: float, k_max: int, v: float = 1.0) -> int:
    factors = [_factor(alpha, k, c, v) for k in range(k_max + 1)]
    return factors.index(max(factors))


def _history(rng: random.Random, n: int, k_max: int, alpha: float, c: float, v: float,
             plain_s: float) -> list[dict]:
    """n verify steps of one request: k drafts proposed, how many passed, proposer and verify seconds
    (a verify step about v plain steps, a draft pass about c plain steps)."""
    steps = []
    for _ in range(n):
        k = rng.randint(1, k_max)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        verify = v * plain_s * rng.uniform(0.8, 1.25)
        propose = k * c * plain_s * rng.uniform(0.8, 1.25)
        steps.append(dict(k=k, accepted=accepted, propose_s=round(propose, 7), verify_s=round(verify, 7)))
    return steps


def _estimates(history: list[dict], plain_s: float) -> tuple[float, float, float, float, float]:
    """(alpha over tested drafts, alpha over proposed drafts, c per draft token, c per step, v), c and v
    against the plain step."""
    accepted = sum(s["accepted"] for s in history)
    tested = sum(s["accepted"] + (s["accepted"] < s["k"]) for s in history)
    drafted = sum(s["k"] for s in history)
    propose, verify = sum(s["propose_s"] for s in history), sum(s["verify_s"] for s in history)
    return (accepted / tested, accepted / drafted, propose / drafted / plain_s,
            propose / len(history) / plain_s, verify / len(history) / plain_s)


def dynamic_k_task(reference: Callable[..., int], warmup_steps: int, probe_every: int,
                   seed: int = 0) -> HintedTask:
    """Implement-it: ``fn(history, plain_s, call, k_max, warmup_steps, probe_every) -> int``, the number of
    drafts to propose at the ``call``-th choice, given ``history`` (a list of dicts, one per verify step of
    one request: k proposed, accepted, propose_s for the k draft passes, verify_s for the verify pass) and
    ``plain_s`` (the seconds of a plain decode step, timed by the runner as it times a verify pass).

    ``reference`` is the runner's rule wrapped to that signature; ``warmup_steps`` and ``probe_every`` are
    its constants, handed to both. The cases cover each outcome (still warming up, a probe, k = 0, an
    interior k, k_max) and histories where the acceptance over proposed drafts, the cost per step
    instead of per draft token, or a verify pass taken to cost one plain step (v = 1) would choose a
    different k."""
    rng = random.Random(seed)
    picked: dict[str, int] = dict.fromkeys(KINDS, 0)
    tricky = {"alpha": 0, "c": 0, "v": 0}
    cases: list[dict] = []
    for _ in range(5000):
        k_max = rng.randint(2, 6)
        n = rng.randint(2, warmup_steps - 1) if rng.random() < 0.15 else rng.randint(warmup_steps, 24)
        alpha, c = rng.choice([0.15, 0.3, 0.5, 0.65, 0.8, 0.9]), rng.choice([0.03, 0.1, 0.25, 0.5, 0.9, 1.3])
        v, plain_s = rng.choice([1.0, 1.1, 1.4, 2.2]), round(0.0025 * rng.uniform(0.8, 1.25), 7)
        history = _history(rng, n, k_max, alpha, c, v, plain_s)
        call = rng.choice([n, n + 1, 10 * rng.randint(1, 4)])
        case = dict(history=history, plain_s=plain_s, call=call, k_max=k_max, warmup_steps=warmup_steps,
                    probe_every=probe_every)
        k = reference(**case)
        a_tested, a_drafted, c_token, c_step, v_est = _estimates(history, plain_s)
        kind = ("warmup" if n < warmup_steps else
                "probe" if k == 1 and _best(a_tested, c_token, k_max, v_est) == 0
                else "zero" if k == 0 else "max" if k == k_max else "interior")
        wanted = picked[kind] < 2
        if n >= warmup_steps and not (kind == "probe" or (kind == "zero" and call % probe_every == 0)):
            others = (("alpha", _best(a_drafted, c_token, k_max, v_est)),
                      ("c", _best(a_tested, c_step, k_max, v_est)),
                      ("v", _best(a_tested, c_token / v_est, k_max)))
            for name, other in others:
                if other != k and tricky[name] < 2:
                    tricky[name] += 1
                    wanted = True
        if wanted:
            picked[kind] += 1
            cases.append(case)
        if all(v >= 2 for v in picked.values()) and all(v >= 2 for v in tricky.values()):
            break
    if not all(picked.values()) or not all(tricky.values()):
        raise RuntimeError(f"could not draw a case of every kind: {picked} {tricky}")

    def show(x) -> str:
        if isinstance(x, list) and x and isinstance(x[0], dict):
            first = ", ".join(f"(k={s['k']}, accepted={s['accepted']})" for s in x[:4])
            return f"[{len(x)} steps: {first}, ...]"
        return repr(x)

    return hinted(ImplementIt(
        "choose_k", reference, cases, show=show,
        hint=("alpha = accepted / tested drafts (a step tests its accepted drafts and, if one failed, that "
              "one); c = (propose seconds per draft token) / plain_s; v = (verify seconds per step) / "
              "plain_s; fewer than warmup_steps steps: k_max; else the k in 0..k_max with the largest "
              "(1 - alpha^(k+1)) / ((1 - alpha)(k c + v)), k = 0 scoring 1, the first on a tie; a 0 on a "
              "call that is a multiple of probe_every becomes 1.")))

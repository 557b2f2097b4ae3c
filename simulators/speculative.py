"""Speculative-decoding exercises: how many tokens does one target pass emit, on average?

Owns seeded questions on the formula E[tokens per target pass] = (1 - a^(k+1)) / (1 - a) (Leviathan et
al. 2023) with a checker that explains wrong answers. Pure Python; imports nothing of ours but the
exercise shapes. ``python -m simulators.speculative -s SEED [-c]`` prints the question (and answer).
"""

from __future__ import annotations

import argparse
import random

from simulators.exercises import Exercise, Verdict


def tokens_per_pass(alpha: float, k: int) -> float:
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def make_exercise(seed: int) -> Exercise:
    """A per-token acceptance a and k drafts per step: answer with the expected tokens per target pass
    (a float; within 0.01 counts)."""
    rng = random.Random(seed)
    alpha = rng.choice([0.5, 0.6, 0.7, 0.77, 0.8, 0.9])
    k = rng.randint(2, 7)
    solution = round(tokens_per_pass(alpha, k), 4)
    question = (f"A draft's tokens are accepted with probability a = {alpha}, independently, and each "
                f"step proposes k = {k} drafts.\nHow many tokens does one target pass emit on average?")

    def diagnose(answer) -> Verdict:
        try:
            value = float(answer)
        except (TypeError, ValueError):
            return Verdict(False, "answer with a number.")
        if abs(value - solution) < 0.01:
            return Verdict(True, f"(1 - {alpha}^{k + 1}) / (1 - {alpha}) = {solution}: the j-th "
                                 f"draft survives with probability {alpha}^j.")
        if abs(value - alpha * k) < 0.01:
            return Verdict(False, "a * k counts drafts as if each were tested independently; a draft "
                                  "after a rejection is never used, and the target adds one token.")
        if abs(value - (solution - 1)) < 0.01:
            return Verdict(False, "that is the accepted drafts only; the target always emits one more "
                                  "token (the recovered or the bonus one).")
        return Verdict(False, "P(the step emits >= i tokens) = a^(i-1); add these up for i = 1..k+1.")

    hint = ("the step emits the accepted prefix of the drafts plus one token of the target's own; sum "
            "P(at least i tokens) over i = 1..k+1.")
    return Exercise(seed, question, solution, diagnose, hint=hint,
                    command=f"python -m simulators.speculative -s {seed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-s", "--seed", type=int, default=0)
    parser.add_argument("-c", "--compute", action="store_true", help="print the answer")
    args = parser.parse_args()
    ex = make_exercise(args.seed)
    print(ex)
    if args.compute:
        print("answer:", ex.solution())


if __name__ == "__main__":
    main()

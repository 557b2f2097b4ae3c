"""Reproducible runs, written after vLLM's examples/offline_inference/reproducibility.py with the same
calls: LLM(seed=...) seeds the engine and the caller's Python, NumPy and torch random state, so running
this script twice prints the same texts and the same random number."""

import random

from minirunner import LLM, SamplingParams

openings = ["ROMEO.", "JULIET.", "Enter HAMLET", "To be, or not to be"]


def main() -> None:
    llm = LLM(seed=7)
    for result in llm.generate(openings, SamplingParams(temperature=0.8, top_p=0.95)):
        print(f"Prompt: {result.prompt!r}\nGenerated text: {result.outputs[0].text!r}")
    print("a number from the caller's seeded random state:", random.randint(0, 100))


if __name__ == "__main__":
    main()

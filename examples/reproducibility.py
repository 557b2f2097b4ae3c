"""Reproducible runs, written after vLLM's examples/offline_inference/reproducibility.py with the same
calls: LLM(seed=...) seeds the engine's own generator, so running this script twice prints the same
texts. Unlike vLLM in one process, it leaves the caller's random state alone: the number printed last
comes from the caller's own seed, as if no engine had run."""

import random

from minirunner import LLM, SamplingParams

openings = ["ROMEO.", "JULIET.", "Enter HAMLET", "To be, or not to be"]


def main() -> None:
    random.seed(0)  # the caller's own generator: the engine neither seeds nor draws from it
    llm = LLM(seed=7)
    for result in llm.generate(openings, SamplingParams(temperature=0.8, top_p=0.95)):
        print(f"Prompt: {result.prompt!r}\nGenerated text: {result.outputs[0].text!r}")
    print("the caller's first random number after seeding itself with 0:", random.randint(0, 100))


if __name__ == "__main__":
    main()

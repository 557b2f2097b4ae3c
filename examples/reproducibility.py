"""vLLM's examples/offline_inference/reproducibility.py, run on minirunner: with LLM(seed=SEED), two runs
of this script print the same texts and the same random number (the engine seeds Python's `random`,
NumPy and torch, as vLLM does). Only the import and the model changed; minirunner runs in this process,
so vLLM's VLLM_ENABLE_V1_MULTIPROCESSING setting is kept but has no effect here."""

import os
import random

from minirunner import LLM, SamplingParams

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

SEED = 42

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    llm = LLM(seed=SEED)
    outputs = llm.generate(prompts, sampling_params)
    print("-" * 50)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}\nGenerated text: {output.outputs[0].text!r}")
        print("-" * 50)
    # The random state of the user's code was seeded by the engine: the same number every run.
    print(random.randint(0, 100))


if __name__ == "__main__":
    main()

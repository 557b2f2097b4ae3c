"""After vLLM's examples/offline_inference/basic/generate.py: start from the model's own default sampling
parameters (its generation_config.json, as vLLM reads it) and override some from the command line.
vLLM's script builds its parser from EngineArgs; this one names the four sampling options itself."""

import argparse

from minirunner import LLM


def main(args: argparse.Namespace) -> None:
    llm = LLM()
    sampling_params = llm.get_default_sampling_params()
    for name in ("max_tokens", "temperature", "top_p", "top_k"):
        if getattr(args, name) is not None:
            setattr(sampling_params, name, getattr(args, name))
    openings = ["ROMEO.", "JULIET.", "Enter HAMLET", "To be, or not to be"]
    for output in llm.generate(openings, sampling_params):
        print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    main(parser.parse_args())

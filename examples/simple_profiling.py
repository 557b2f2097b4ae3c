"""A step timeline, written after vLLM's examples/offline_inference/simple_profiling.py with the same
calls: VLLM_TORCH_PROFILER_DIR names the trace directory, start_profile() / stop_profile() wrap the
engine steps in torch.profiler, and the trace (open it in https://ui.perfetto.dev) is written by the time
stop_profile() returns."""

import os

from minirunner import LLM, SamplingParams

os.environ.setdefault("VLLM_TORCH_PROFILER_DIR", "./vllm_profile")

if __name__ == "__main__":
    llm = LLM(tensor_parallel_size=1)
    llm.start_profile()
    results = llm.generate(["ROMEO.", "JULIET.", "Enter HAMLET", "To be, or not to be"],
                           SamplingParams(temperature=0.8, top_p=0.95))
    llm.stop_profile()
    for result in results:
        print(f"Prompt: {result.prompt!r}, Generated text: {result.outputs[0].text!r}")

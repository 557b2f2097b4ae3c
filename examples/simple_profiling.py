"""vLLM's examples/offline_inference/simple_profiling.py, run on minirunner: torch.profiler around the
engine steps, its trace written under $VLLM_TORCH_PROFILER_DIR (open it at https://ui.perfetto.dev).
Only the import and the model changed, and the final sleep is gone: the trace is written before
stop_profile() returns (vLLM waits for a background process)."""

import os

from minirunner import LLM, SamplingParams

# enable torch profiler, can also be set on cmd line
os.environ["VLLM_TORCH_PROFILER_DIR"] = "./vllm_profile"

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)

if __name__ == "__main__":
    llm = LLM(tensor_parallel_size=1)
    llm.start_profile()
    outputs = llm.generate(prompts, sampling_params)
    llm.stop_profile()
    for output in outputs:
        print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")

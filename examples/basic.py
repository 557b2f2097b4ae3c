"""The smallest offline run, written after vLLM's examples/offline_inference/basic/basic.py with the same
calls a vLLM user makes: LLM(), SamplingParams(temperature, top_p), generate, then each output's prompt
and first completion. LLM() serves the embedded Shakespeare model."""

from minirunner import LLM, SamplingParams

openings = ["ROMEO.", "JULIET.", "Enter HAMLET", "To be, or not to be"]
params = SamplingParams(temperature=0.8, top_p=0.95)

llm = LLM()
for result in llm.generate(openings, params):
    print(f"Prompt: {result.prompt!r}, Generated text: {result.outputs[0].text!r}")

"""minirunner: a compact paged-KV, continuous-batching LLM inference runner.

``from minirunner import LLM, SamplingParams`` mirrors vLLM's offline API.
"""

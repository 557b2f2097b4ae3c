"""minirunner: a compact paged-KV, continuous-batching LLM inference runner.

``from minirunner import LLM, SamplingParams`` mirrors vLLM's offline API.
"""

from minirunner.llm import LLM
from minirunner.outputs import CompletionOutput, RequestMetrics, RequestOutput, StreamChunk
from minirunner.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput",
           "RequestMetrics", "StreamChunk"]
__version__ = "0.1.0"

"""Structured output (grammar-constrained decoding) through xgrammar, vLLM's default backend.

``params.py`` holds the request's constraint (StructuredOutputsParams, plain data); ``compiler.py`` turns it
into a compiled grammar for the model's tokenizer (cached); ``manager.py`` keeps one matcher per request on
the host and writes each step's token bitmasks into the SchedulerOutput; ``bitmask.py`` is the worker's
side: it applies those bitmasks to the logits before sampling. Only ``params`` is imported here, so
``SamplingParams`` never needs xgrammar or torch.
"""

from minirunner.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]

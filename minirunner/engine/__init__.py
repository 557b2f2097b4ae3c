"""The host side of a step: LLMEngine (engine.py), building it (build.py), turning prompts into requests
(input_processor.py), the scheduler, applying a step's results (output_processor.py), detokenisation and
the step trace. Nothing here touches a device tensor except through the worker's ModelRunner."""

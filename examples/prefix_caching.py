"""After vLLM's examples/offline_inference/prefix_caching.py: the same greedy prompts with and without
enable_prefix_caching give the same text; the second engine serves the shared prefix from its cache.
Differences: the embedded model, a Shakespearean prefix, and no cleanup_dist_env_and_memory (one
process holds nothing to clean up); the cached-token count is printed as well."""

from minirunner import LLM, SamplingParams

# Common prefix.
prefix = ("ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is "
          "the sun. Arise, fair sun, and kill the envious moon, who is already sick and pale with "
          "grief. Continue the scene: ")
prompts = ["JULIET.", "NURSE.", "MERCUTIO.", "FRIAR LAURENCE."]
generating_prompts = [prefix + prompt for prompt in prompts]
sampling_params = SamplingParams(temperature=0.0)


def main():
    regular_llm = LLM()
    print("Results without `enable_prefix_caching`")
    outputs = regular_llm.generate(generating_prompts, sampling_params)
    regular_generated_texts = [output.outputs[0].text for output in outputs]
    del regular_llm

    prefix_cached_llm = LLM(enable_prefix_caching=True)
    prefix_cached_llm.generate(generating_prompts[0], sampling_params)  # warm the shared prefix
    outputs = prefix_cached_llm.generate(generating_prompts, sampling_params)
    print("Results with `enable_prefix_caching`")
    for output in outputs:
        print(f"Prompt: {output.prompt[len(prefix):]!r} (after the prefix), cached prompt tokens: "
              f"{output.num_cached_tokens}\nGenerated text: {output.outputs[0].text!r}")
    cached_generated_texts = [output.outputs[0].text for output in outputs]
    print(f"Generated answers are the same: {regular_generated_texts == cached_generated_texts}")


if __name__ == "__main__":
    main()

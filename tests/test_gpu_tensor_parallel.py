"""``LLM(tensor_parallel_size=2)`` on two CUDA GPUs over NCCL equals one GPU (run by scripts/gpu_check.sh).

The embedded default model in fp32: greedy tokens identical and logprobs within 1e-4 (GPU matmuls split
over two ranks sum in another order). Skipped, with the reason shown, on a machine with fewer than two
GPUs. Written for the prepared GPU run; not yet run on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from minirunner import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2,
                       reason=f"tensor_parallel_size=2 needs 2 CUDA GPUs; this machine has "
                              f"{torch.cuda.device_count()}"),
]


def test_two_gpus_match_one():
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 3 * i))} for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    got = {}
    for n in (1, 2):
        with LLM(device="cuda", dtype="float32", tensor_parallel_size=n, num_kv_blocks=64,
                 enable_prefix_caching=True) as llm:
            got[n] = llm.generate(prompts, params, use_tqdm=False)
    one, two = got[1], got[2]
    assert [o.outputs[0].token_ids for o in two] == [o.outputs[0].token_ids for o in one]
    for a, b in zip(one, two, strict=True):
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            for token, lp in x.items():
                assert abs(lp.logprob - y[token].logprob) <= 1e-4

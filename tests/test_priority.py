"""Priority scheduling as vLLM documents it: ``LLM(scheduling_policy="priority")`` serves the lowest
``priority`` value first (ties by arrival) and, when the KV pool runs dry, preempts the least urgent
running request (largest value, latest arrival) instead of the newest; the default "fcfs" refuses a
non-zero priority. Outputs never depend on the order requests are served in."""

from __future__ import annotations

import pytest
from tiny_models import add_tokenizer, make_tiny_model

from minirunner import LLM, SamplingParams

CPU = dict(dtype="float32", device="cpu", attention_backend="torch")
# two seats and ten 4-token blocks: the requests below cannot all run, and running ones run out of blocks
TIGHT = dict(num_kv_blocks=10, block_size=4, max_num_seqs=2, max_num_batched_tokens=32, **CPU)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path, _ = make_tiny_model(tmp_path_factory.mktemp("priority"), "llama_gqa")
    add_tokenizer(path)
    return path


def finish_steps(trace):
    return {rid: t["step"] for t in trace for rid in t["finished_ids"]}


def run_late_arrival(model_dir, policy, late_priority):
    """Three requests of priority 0 arrive; two steps later a fourth (``late_priority``) arrives."""
    llm = LLM(str(model_dir), scheduling_policy=policy, **TIGHT)
    engine = llm.llm_engine
    early = [engine.add_request([3 + i] * 10, SamplingParams(temperature=1.0, seed=i, max_tokens=n,
                                                             ignore_eos=True))
             for i, n in enumerate((4, 16, 16))]
    engine.step()
    engine.step()
    late = engine.add_request([20] * 10, SamplingParams(temperature=1.0, seed=9, max_tokens=12,
                                                        ignore_eos=True), priority=late_priority)
    while engine.has_unfinished_requests():
        engine.step()
    outputs = {rid: engine.pop_finished(rid).outputs[0].token_ids for rid in [*early, late]}
    return early, late, llm.get_step_trace(), outputs


def test_an_urgent_late_request_finishes_before_earlier_ones_and_is_never_the_victim(model_dir):
    early, late, trace, outputs = run_late_arrival(model_dir, "priority", -1)
    steps = finish_steps(trace)
    # when it arrived, early[0] was about to finish; early[1] was running and early[2] waiting
    assert steps[late] < steps[early[1]] and steps[late] < steps[early[2]]
    preempted = [rid for t in trace for rid in t["preempted_ids"]]
    assert preempted, "the pool is tight enough to preempt"
    assert late not in preempted
    _, _, fcfs_trace, fcfs_outputs = run_late_arrival(model_dir, "fcfs", 0)
    assert outputs == fcfs_outputs  # seeded outputs do not depend on the serving order


def test_fcfs_serves_in_arrival_order_and_preempts_the_newest(model_dir):
    early, late, trace, _ = run_late_arrival(model_dir, "fcfs", 0)
    steps = finish_steps(trace)
    assert steps[late] > max(steps[rid] for rid in early)  # the late request waits its turn
    admitted, before = {}, set()  # request id -> (the step it was last admitted in, its place there)
    preemptions = 0
    for t in trace:  # the victim is always the most recently admitted of the requests running
        for victim in t["preempted_ids"]:
            preemptions += 1
            assert all(admitted[victim] > admitted[rid] for rid in t["request_ids"] if rid in before)
        now = set(t["request_ids"])
        admitted.update({rid: (t["step"], i) for i, rid in enumerate(t["request_ids"]) if rid not in before})
        before = now
    assert preemptions


def test_lowest_value_first_ties_by_arrival(model_dir):
    llm = LLM(str(model_dir), scheduling_policy="priority", max_num_seqs=1, **CPU)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13]]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False, priority=[2, 0, 1, 0])
    order = [rid for t in llm.get_step_trace() for rid in t["finished_ids"]]
    assert order == [outs[i].request_id for i in (1, 3, 2, 0)]
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == alone


def test_fcfs_refuses_a_priority_and_queues_nothing(model_dir):
    llm = LLM(str(model_dir), **CPU)
    params = SamplingParams(max_tokens=2)
    with pytest.raises(ValueError, match="Priority scheduling is not enabled") as err:
        llm.generate(["a b", "c d"], params, use_tqdm=False, priority=[0, 1])
    assert "scheduling_policy='priority'" in str(err.value)
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="Priority scheduling is not enabled"):
        llm.llm_engine.add_request("a b", params, priority=3)
    assert not llm.llm_engine.has_unfinished_requests()
    outs = llm.generate(["a b", "c d"], params, use_tqdm=False, priority=[0, 0])  # zeros are FCFS
    assert len(outs) == 2


def test_bad_priority_arguments(model_dir):
    llm = LLM(str(model_dir), scheduling_policy="priority", **CPU)
    params = SamplingParams(max_tokens=2)
    with pytest.raises(ValueError, match="lengths of prompts and priority must be the same"):
        llm.generate(["a b", "c d"], params, use_tqdm=False, priority=[1])
    with pytest.raises(ValueError, match="priority must be an integer"):
        llm.generate(["a b"], params, use_tqdm=False, priority=[0.5])
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        LLM(str(model_dir), scheduling_policy="lifo", **CPU)

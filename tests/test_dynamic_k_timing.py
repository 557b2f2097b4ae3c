"""The acceptance-driven k measures the target step by its device time, as a GPU reports it: ``execute``
returns as soon as the step is queued, and the step's device time arrives with its output. Injected here
on a CPU (a real engine and runner, whose launch is read later with a stated device time), so the
controller sees what it would see on a GPU. Before the fix the engine timed the launch on the host,
so the cost ratio c = propose / verify was inflated and k fell to 0."""

from __future__ import annotations

import pytest
from test_spec_decode import pair  # noqa: F401

from minirunner import LLM, SamplingParams
from minirunner.spec_decode.dynamic import WARMUP_STEPS, AcceptanceDrivenK
from minirunner.spec_decode.metrics import SpecStats

DEVICE_S = 5.0  # what a GPU would report for one verify step of a (slow) target


class QueuedStep:
    """What a GPU's ``execute`` returns: the step queued; its output (and device time) read later."""

    def __init__(self, launch):
        self._launch = launch

    def prev_sampled(self):
        return None

    def get_output(self):
        out = self._launch().get_output()
        out.device_s = DEVICE_S
        return out


def test_dynamic_k_reads_the_device_time_of_the_step(pair):  # noqa: F811
    llm = LLM(pair["target"], device="cpu", attention_backend="torch", speculative_config={
        "method": "draft_model", "model": pair["same"], "num_speculative_tokens": 3,
        "dynamic_k": "acceptance"})
    runner = llm.engine.runner
    execute = runner.execute
    runner.execute = lambda *args, **kwargs: QueuedStep(lambda: execute(*args, **kwargs))
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
                 use_tqdm=False)
    dynamic = llm.engine.spec.dynamic
    # the controller's target time is the device time each step reported, not the launch's host time
    assert dynamic.verify_steps > WARMUP_STEPS
    assert dynamic.verify_s == pytest.approx(DEVICE_S * dynamic.verify_steps)
    ks = [max(k for k, _ in t["spec_runs"].values()) if t["spec_runs"] else 0
          for t in llm.get_step_trace()]
    steady = ks[WARMUP_STEPS + 2:-3]  # past the warm-up, before max_tokens trims k
    # an exact draft (alpha 1) whose passes cost less than the target's step: k stays at k_max, but for
    # the plain decode steps a probe takes to time v (every plain step here reports the same device time)
    assert dynamic.plain_steps >= 1 and dynamic.measured_verify_ratio() == pytest.approx(1.0)
    assert steady and set(steady) <= {0, 3} and steady.count(0) <= 2, ks


def test_choose_k_is_pure():
    """Asking for k changes nothing: the probe counter moves once per step that proposes."""
    dynamic = AcceptanceDrivenK(4, cost_ratio=5.0)  # drafts cost more than they save: k 0, probes
    stats = SpecStats()
    for _ in range(WARMUP_STEPS):
        stats.record(4, 0)
    asked = [dynamic.choose(stats) for _ in range(25)]
    assert len(set(asked)) == 1, asked
    decided = []
    for _ in range(20):
        decided.append(dynamic.choose(stats))
        dynamic.advance()
    assert decided.count(1) == 2 and decided.count(0) == 18, decided


@pytest.mark.parametrize("cost_ratio", [None, 0.01])
def test_warm_up_uses_k_max(cost_ratio):
    dynamic = AcceptanceDrivenK(4, cost_ratio)
    assert dynamic.choose(SpecStats()) == 4

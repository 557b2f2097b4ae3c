"""A synchronous step drawn over as many steps as an async run (notebook 07's same-length timelines)."""

from __future__ import annotations

import pytest

from simulators.launch import repeat_steps, simulate


def test_a_synchronous_step_repeated_ends_after_n_steps_and_keeps_its_per_step_figures():
    one = simulate([250.0], 0.0, "graph", host_other_us=100.0)
    six = repeat_steps(one, 6)
    assert six.num_steps == 6 and six.step_us == one.step_us == 350.0
    assert len(six.events) == 6 * len(one.events)
    assert max(e.end_us for e in six.events) == pytest.approx(6 * 350.0)
    # host and device never overlap in a synchronous run: each step starts when the last one ended
    for s in range(1, 6):
        starts = min(e.start_us for e in six.events if e.step == s)
        ends = max(e.end_us for e in six.events if e.step == s - 1)
        assert starts == pytest.approx(ends)
    ahead = simulate([250.0], 0.0, "graph_async", host_other_us=100.0, num_steps=6)
    # over the same six steps the async run finishes first
    assert max(e.end_us for e in ahead.events) < max(e.end_us for e in six.events)
    with pytest.raises(ValueError):
        repeat_steps(ahead, 6)

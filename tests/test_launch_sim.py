"""The launch-overhead simulator against cases worked by hand, and its command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simulators.buckets import capture_sizes, padded_batch_size
from simulators.launch import dispatch_us_per_token, predict_gpu_speedup, simulate
from simulators.launch_problems import (
    make_bucket_exercise,
    make_graph_exercise,
    make_remedy_exercise,
    make_step_exercise,
    random_problem,
)


def test_eager_step_is_host_bound_when_a_launch_costs_more_than_a_kernel():
    # 10 launches of 10 µs, kernels of 5 µs: each kernel waits for its launch; the last one ends at
    # 10 * 10 + 5 = 105, and the device worked 50 of those µs.
    r = simulate([5.0] * 10, launch_us=10.0)
    assert r.step_us == 105.0
    assert r.bound == "host"
    assert r.host_busy_us == 100.0 and r.device_busy_us == 50.0
    assert r.device_idle_fraction == pytest.approx(55 / 105)


def test_eager_step_is_device_bound_when_a_launch_costs_less_than_a_kernel():
    # The first launch takes 5 µs, then the device runs 10 kernels of 10 µs back to back: 105.
    r = simulate([10.0] * 10, launch_us=5.0)
    assert r.step_us == 105.0
    assert r.bound == "device"
    assert r.device_idle_fraction == pytest.approx(5 / 105)


def test_mixed_kernels_follow_start_is_max_of_issue_and_previous_end():
    # launch 4: issue ends at 4, 8, 12; kernels 10, 1, 1 -> [4,14], [14,15], [15,16]
    r = simulate([10.0, 1.0, 1.0], launch_us=4.0)
    kernels = [(e.start_us, e.end_us) for e in r.events if e.kind == "kernel"]
    assert kernels == [(4.0, 14.0), (14.0, 15.0), (15.0, 16.0)]


def test_graph_removes_the_per_operator_host_cost():
    eager = simulate([5.0] * 10, 10.0, host_other_us=20.0)
    graph = simulate([5.0] * 10, 10.0, "graph", host_other_us=20.0)
    assert eager.host_busy_us == 20.0 + 10 * 10.0
    assert graph.host_busy_us == 20.0 + 10.0  # one launch for the whole step
    assert graph.step_us == 20.0 + 10.0 + 50.0
    assert graph.bound == "device" and eager.bound == "host"
    assert [e.kind for e in graph.events if e.resource == "host"] == ["prepare", "graph_launch"]


def test_graph_node_cost_is_device_time_per_node():
    graph = simulate([5.0] * 4, 10.0, "graph", graph_launch_us=3.0, node_us=0.5)
    assert graph.step_us == 3.0 + 4 * 5.5


def test_a_graph_saves_little_on_a_device_bound_step():
    eager = simulate([10.0] * 10, 5.0)
    graph = simulate([10.0] * 10, 5.0, "graph")
    assert eager.step_us == graph.step_us == 105.0


def test_synchronous_launches_add_launch_and_kernel_times():
    # a CPU (host thread = device) or a sync after each launch: nothing overlaps
    r = simulate([3.0, 7.0], 2.0, synchronous=True, host_other_us=1.0)
    assert r.step_us == 1.0 + (2 + 3) + (2 + 7)


def test_postprocess_waits_for_the_device():
    r = simulate([50.0], 1.0, postprocess_us=4.0)
    post = next(e for e in r.events if e.kind == "postprocess")
    assert post.start_us == 51.0 and r.step_us == 55.0


def test_batch_17_on_the_ladder_pads_7_rows():
    ladder = [1, 2, 4, 8, 16, 24, 32]
    assert padded_batch_size(17, ladder) == 24
    r = simulate([2.0] * 3, 1.0, "graph_ladder", batch_size=17, ladder=ladder, padded_row_us=0.5)
    assert (r.bucket, r.padded_rows) == (24, 7)
    assert r.device_busy_us == 3 * (2.0 + 7 * 0.5)
    assert r.step_us == 1.0 + 3 * 5.5


def test_graph_ladder_above_the_largest_rung_runs_eager():
    r = simulate([2.0] * 3, 1.0, "graph_ladder", batch_size=40, ladder=[1, 2, 4, 8, 16, 24, 32])
    assert r.bucket is None and r.padded_rows == 0
    assert r.step_us == simulate([2.0] * 3, 1.0).step_us


def test_default_ladder_doubles_to_8_then_steps_by_8():
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert capture_sizes(6) == [1, 2, 4]
    assert capture_sizes(20) == [1, 2, 4, 8, 16]
    assert [padded_batch_size(b, max_num_seqs=64) for b in (1, 3, 5, 8, 9, 63)] == [1, 4, 8, 8, 16, 64]
    assert padded_batch_size(33, max_num_seqs=32) is None


@pytest.mark.parametrize("bad", [[], [0, 2], [2, 2], [1.5]])
def test_bad_ladder_is_refused_with_a_reason(bad):
    with pytest.raises(ValueError, match="capture"):
        padded_batch_size(1, bad)


def test_bad_inputs_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="mode"):
        simulate([1.0], 1.0, "replay")
    with pytest.raises(ValueError, match="at least one operator"):
        simulate([], 1.0)
    with pytest.raises(ValueError, match="launch_us"):
        simulate([1.0], -1.0)
    with pytest.raises(ValueError, match="batch_size"):
        padded_batch_size(0)


def test_seed_illustration_60_kernels_of_5us():
    # the seed article's arithmetic: 60 kernels x 5 µs = 300 µs of dispatch per token, 60 ms per 200
    assert dispatch_us_per_token(60, 5.0) == 300.0
    assert dispatch_us_per_token(60, 5.0) * 200 / 1000 == 60.0
    # the same numbers through the simulator: with kernels shorter than a launch the host sets the pace
    eager = simulate([1.0] * 60, 5.0)
    graph = simulate([1.0] * 60, 5.0, "graph")
    assert eager.host_busy_us == 300.0
    assert eager.step_us == 301.0 and eager.bound == "host"
    assert graph.host_busy_us == 5.0 and graph.step_us == 65.0
    assert 200 * (eager.step_us - graph.step_us) / 1000 == pytest.approx(47.2)


def test_async_hides_other_host_work_behind_the_device():
    kernels, launch, other, post = [10.0] * 10, 5.0, 20.0, 10.0
    eager = simulate(kernels, launch, host_other_us=other, postprocess_us=post)
    overlapped = simulate(kernels, launch, "async", host_other_us=other, postprocess_us=post)
    assert eager.step_us == other + launch + 100.0 + post
    assert overlapped.step_us == 100.0  # the device never waits: host work 80 < device work 100
    assert overlapped.num_steps == 6 and overlapped.device_idle_fraction == 0.0
    # host-bound: the steady state is the host's own work per step
    host_bound = simulate([1.0] * 10, 5.0, "async", host_other_us=20.0, postprocess_us=10.0)
    assert host_bound.step_us == 20.0 + 50.0 + 10.0


def test_graph_async_device_bound_step_costs_the_device_time():
    # 10 nodes of 10 µs; host per step = 20 prepare + 5 graph launch + 10 postprocess = 35 < 100:
    # in the steady state the device replays back to back and the step is the device's 100 µs
    r = simulate([10.0] * 10, 5.0, "graph_async", host_other_us=20.0, postprocess_us=10.0)
    assert r.step_us == 100.0
    assert r.device_idle_fraction == 0.0 and r.bound == "device"
    assert r.host_busy_us == 35.0 and r.device_busy_us == 100.0
    assert [e.kind for e in r.events if e.resource == "host" and e.step == 2] == [
        "prepare", "graph_launch", "postprocess"]


def test_graph_async_host_bound_step_costs_the_host_time():
    # 10 nodes of 1 µs (10 µs of device work) against 20 + 5 + 10 = 35 µs of host work per step
    r = simulate([1.0] * 10, 5.0, "graph_async", host_other_us=20.0, postprocess_us=10.0)
    assert r.step_us == 35.0 and r.bound == "host"
    assert r.device_idle_fraction == pytest.approx(25 / 35)
    # node cost is device time: 10 nodes x (1 + 0.5) = 15 µs, still under the host's 35
    assert simulate([1.0] * 10, 5.0, "graph_async", host_other_us=20.0, postprocess_us=10.0,
                    node_us=0.5).device_busy_us == 15.0


def test_graph_async_is_never_slower_than_graph_or_async_alone():
    for kernels, launch, other, post in (([1.0] * 20, 5.0, 30.0, 10.0), ([8.0] * 20, 2.0, 30.0, 10.0),
                                         ([3.0, 9.0, 1.0] * 7, 4.0, 0.0, 0.0)):
        kw = {"host_other_us": other, "postprocess_us": post}
        both = simulate(kernels, launch, "graph_async", **kw).step_us
        assert both <= simulate(kernels, launch, "graph", **kw).step_us
        assert both <= simulate(kernels, launch, "async", **kw).step_us
        # the steady state of two overlapped resources: the larger of their work per step
        assert both == max(other + launch + post, sum(kernels))


def test_gpu_prediction_is_eager_over_graph_by_hand():
    # 100 kernels of 2 µs, 5 µs per launch: eager = 100 x 5 + 2 = 502 (host-bound);
    # graph = 5 + 100 x 2 = 205; graph + async = max(5, 200) = 200
    p = predict_gpu_speedup(100, kernel_us=2.0, launch_us=5.0)
    assert p.eager.step_us == 502.0 and p.graph.step_us == 205.0 and p.graph_async.step_us == 200.0
    assert p.speedup == pytest.approx(502 / 205)
    assert [r.mode for r in p.modes()] == ["eager", "graph", "async", "graph_async"]
    with pytest.raises(ValueError, match="positive"):
        predict_gpu_speedup(0)


def test_gpu_prediction_charges_views_to_the_eager_host_and_keeps_a_kernel_minimum():
    # 100 kernels of 0.5 µs raised to a 2.5 µs minimum; 100 views at 1 µs each ride on the launches:
    # eager host = 100 x (5 + 1) = 600, the last kernel ends at 600 + 2.5; graph = 5 + 100 x 2.5 = 255
    p = predict_gpu_speedup(100, kernel_us=0.5, launch_us=5.0, num_views=100, view_us=1.0, kernel_min_us=2.5)
    assert p.eager.step_us == 602.5 and p.graph.step_us == 255.0
    no_views = predict_gpu_speedup(100, kernel_us=0.5, launch_us=5.0, kernel_min_us=2.5)
    assert no_views.graph.step_us == p.graph.step_us  # a replay re-runs kernels, not views
    assert no_views.eager.step_us == 502.5
    # views cost a dispatch like any operator unless told otherwise
    assert predict_gpu_speedup(10, 1.0, 4.0, num_views=10).eager.step_us == 10 * 8 + 1
    with pytest.raises(ValueError, match="num_views"):
        predict_gpu_speedup(10, num_views=-1)


def test_exercises_check_their_own_solutions_and_explain_wrong_answers():
    for seed in range(5):
        for make in (make_step_exercise, make_graph_exercise, make_bucket_exercise,
                     make_remedy_exercise):
            ex = make(seed=seed)
            assert ex.check(ex.solution()).correct
            pending = ex.check(None)
            assert not pending.answered and str(pending).startswith("not answered yet")
    p = random_problem(3)
    ex = make_step_exercise(seed=3)
    serial = p.host_other_us + len(p.kernel_us) * p.launch_us + sum(p.kernel_us)
    if serial != ex.solution():
        assert "overlap" in ex.check(serial).why
    remedy = make_remedy_exercise(seed=3)
    wrong = next((c for c in "abc" if not remedy.check(c).correct), None)
    if wrong is not None:
        assert "simulate all three" in remedy.check(wrong).why
    bucket = make_bucket_exercise(seed=3)
    assert not bucket.check((1, 0)).correct or p.batch_size == 1


def test_command_line_hides_answers_unless_asked():
    run = [sys.executable, "-m", "simulators.launch", "-s", "4"]
    plain = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    shown = subprocess.run(run + ["-c"], capture_output=True, text=True, check=True).stdout
    assert "ARG seed 4" in plain and "ARG compute answers False" in plain
    assert "answer:" not in plain and "-c" in plain
    p = random_problem(4)
    eager = simulate(p.kernel_us, p.launch_us, host_other_us=p.host_other_us)
    assert f"answer: {eager.step_us:g} µs, {eager.bound}-bound" in shown
    assert plain == subprocess.run(run, capture_output=True, text=True, check=True).stdout  # seeded


def test_simulator_imports_without_torch():
    code = ("import sys, simulators.launch, simulators.launch_problems, simulators.graph_exercises; "
            "assert 'torch' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"

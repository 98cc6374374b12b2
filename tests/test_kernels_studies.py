"""The GPU studies' arithmetic on the CPU: kernels.studies.serving_grid.step_figures splits a profiled
step (StepTimer's CUDA graph of per-step work, then layers x [flush, call]) into per-layer figures;
the GPU part (graph, profiler) runs only on the lent H200 (kernels/BENCHMARKS.md section 6)."""

from kernels.studies.serving_grid import step_figures


def test_step_figures_sum_each_calls_kernels_and_keep_layers_and_replays_apart():
    # 2 replays x 3 layers, 2 kernels a call: calls of 3, 7, 11 us, then 15, 19, 23 us
    calls = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
    got = step_figures(calls, [2.0, 4.0], replays=2, layers=3)
    assert got == {"first_layer_us": 9.0, "later_layers_median_us": 15.0, "mean_per_layer_us": 13.0,
                   "per_step_us": 3.0, "layers": 3, "replays": 2}


def test_step_figures_refuse_durations_that_do_not_split():
    assert step_figures([1.0] * 7, [], replays=2, layers=3) is None  # 7 kernels for 6 calls
    assert step_figures([1.0] * 6, [1.0] * 3, replays=2, layers=3) is None  # per-step work unequal
    assert step_figures([], [], replays=2, layers=3) is None


def test_step_figures_without_per_step_kernels_or_later_layers():
    got = step_figures([4.0, 6.0], [], replays=2, layers=1)
    assert got["per_step_us"] is None and got["later_layers_median_us"] is None
    assert got["first_layer_us"] == 5.0 and got["mean_per_layer_us"] == 5.0

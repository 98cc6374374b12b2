"""Studies run on the GPU machine (torch + triton only, as kernels/): the GPU suite that captures
the test traces and runs the GPU tests (`gpu_suite`), the serving-grid and live-row studies of the
SGLang patch's kernel (`serving_grid`, `live_study`, `tune_gather`), the H200 sample series
(`demo_series`) and the shape captures (`capture_shapes`). Results in kernels/BENCHMARKS.md and
kernels/results/; nothing at run time imports them. May import kernels.
"""

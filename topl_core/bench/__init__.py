"""Benchmarks of the `bench` command: each figure a ratio of two things measured side by side in one run.

    workbench.py  `bench`: MFU, TOPL vs SFT step, steering, capture, sweep reuse, cache, memory (run_bench)
    scale.py      `bench --scale`: the paper's presets at their published shape on one device (run_scale_bench)
    slider.py     `bench --slider`: a new λ of the Steering page's slider against plain generate (slider_bench)
    gated.py      `bench --gated`: gated steering against always-on steering and plain generate (gated_bench)
    timing.py     what they time with: best_times (in turns), sync (a GPU's wait), matmul_peak_tflops

Import the module you need: this package imports none of them.
"""

"""Measuring the engine: the benchmark against HF `generate`, the roofline and the kernel ceilings.

    python -m engine bench --quick --json        # the same as python -m engine.bench --quick --json

Modules: `engine.bench.bench` (the run and its command line), `engine.bench.report` (ratios,
targets, bounds, the text report), `engine.bench.roofline` (this machine's bandwidth and GEMM
roofs), `engine.bench.ceilings` (the model's own GEMMs timed alone). A subpackage of the engine's,
built on it: the inference code never imports it (only the engine's command line does), so an
engine never loads the benchmarks' dependencies.
"""

"""Measuring the engine: the benchmark against HF `generate`, the roofline and the kernel ceilings.

    python -m bench --quick --json        # or, the same, python -m engine bench --quick --json

Modules: `bench.bench` (the run and its command line), `bench.report` (ratios, targets, bounds,
the text report), `bench.roofline` (this machine's bandwidth and GEMM roofs), `bench.ceilings`
(the model's own GEMMs timed alone). Kept out of `engine/` so the engine package holds inference
only; this package imports the engine, never the other way round.
"""

"""Two-Pot Kitchen's inference engine: prefill (the wok) and decode (the soup pot), in plain PyTorch.

    from engine import Engine
    eng = Engine.load("assets/models/chef", device="cpu", dtype="float32")
    res = eng.generate(["ROMEO:"], max_new_tokens=32)

See docs/engine-api.md for the contract. This package never imports streamlit.

Why OMP_WAIT_POLICY=PASSIVE (set here only if unset, and only effective when this package is
imported before torch): PyTorch's OpenMP threads spin while waiting for work. On a machine whose
cores are shared with other processes, a spinning thread steals the core its partner needs, and a
SmolLM2-135M decode step measured 10x slower with 2 threads than with 1 (650 ms vs 64 ms per token);
with passive waiting the 2-thread step was back to ~50-110 ms. The price on an idle machine: every
parallel region wakes a sleeping thread, and a quiet 2-thread step took 66 ms passive vs 37 ms with
ACTIVE (docs/benchmarks/README.md). Export OMP_WAIT_POLICY=ACTIVE on an otherwise idle machine.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine.engine import Engine, ServingConfig, ServingLimits
from engine.errors import EngineError
from engine.loader import ModelInfo
from engine.model import decode_one_token, prefill
from engine.results import GenerationResult, RequestMetrics, RequestResult
from engine.trace import Metrics, StepRecord, Trace

__all__ = [
    "Engine",
    "EngineError",
    "GenerationResult",
    "Metrics",
    "ModelInfo",
    "RequestMetrics",
    "RequestResult",
    "ServingConfig",
    "ServingLimits",
    "StepRecord",
    "Trace",
    "decode_one_token",
    "prefill",
]

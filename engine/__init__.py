"""Two-Pot Kitchen's inference engine: prefill (the wok) and decode (the soup pot), in plain PyTorch.

    from engine import Engine
    eng = Engine.load("assets/models/chef", device="cpu", dtype="float32")
    res = eng.generate(["ROMEO:"], max_new_tokens=32)

See docs/engine-api.md for the contract. This package never imports streamlit.

Why OMP_WAIT_POLICY=PASSIVE (set here only if unset, and only effective when this package is
imported before torch): PyTorch's OpenMP threads spin while waiting for work, and on cores shared
with other processes a spinning thread steals the core its partner needs. The price on an idle
machine is that every parallel region wakes a sleeping thread, so export OMP_WAIT_POLICY=ACTIVE
when the cores are yours alone (the numbers: docs/benchmarks/engine-choices.md).
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

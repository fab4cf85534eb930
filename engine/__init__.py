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

libgomp reads the policy once, when torch loads it: a script that imports torch before engine
runs libgomp's default (spin a while, then sleep) whatever the variable says afterwards, and the
two can differ twofold in decode speed (docs/benchmarks/compiled-cpu.md). So
`OMP_WAIT_POLICY_IN_EFFECT` says what OpenMP really does here, and bench reports record it.
"""

import os
import sys

_torch_first, _asked = "torch" in sys.modules, os.environ.get("OMP_WAIT_POLICY")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
OMP_WAIT_POLICY_IN_EFFECT = _asked or ("default (torch imported before engine)" if _torch_first else "PASSIVE")

from engine.engine import Engine, ServingConfig, ServingLimits  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.loader import ModelInfo  # noqa: E402
from engine.model import decode_one_token, prefill  # noqa: E402
from engine.results import GenerationResult, RequestMetrics, RequestResult  # noqa: E402
from engine.trace import Metrics, StepRecord, Trace  # noqa: E402

__all__ = [
    "Engine",
    "EngineError",
    "OMP_WAIT_POLICY_IN_EFFECT",
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

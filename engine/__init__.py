"""Two-Pot Kitchen's inference engine: prefill (the wok) and decode (the soup pot), in plain PyTorch.

    from engine import Engine
    eng = Engine.load("chef", device="cpu", dtype="float32")
    res = eng.generate(["ROMEO:"], max_new_tokens=32)

See docs/engine-api.md for the contract. This package never imports streamlit.

Why OMP_WAIT_POLICY=PASSIVE (set here only if unset, and only effective when this package is
imported before torch): between parallel regions PyTorch's OpenMP threads either sleep (PASSIVE)
or spin. On cores shared with other processes a spinning thread holds the core the thread it waits
for needs, and decode collapses: with far more runnable threads than cores, ACTIVE decoded the chef
16x slower than PASSIVE and a 10,000-iteration bounded spin (GOMP_SPINCOUNT) 11x slower, and a
busy neighbouring process kept 30 % (ACTIVE) and 76 % (the spin) of its speed, against 96 % beside
PASSIVE. On idle cores ACTIVE was 4x faster, but beside one busy process 2.3x slower than PASSIVE.
So only a machine whose cores belong to the engine alone should export OMP_WAIT_POLICY=ACTIVE
(docs/benchmarks/wait-policy-cpu.md has the measurements).

libgomp reads the policy once, when torch loads it: a script that imports torch before engine
runs libgomp's default (spin a while, then sleep) whatever the variable says afterwards, and the
two can differ twofold in decode speed (docs/benchmarks/compiled-cpu.md). So
`OMP_WAIT_POLICY_IN_EFFECT` says what OpenMP really does here, and bench reports record it.
"""

import os
import sys

_torch_first, _asked = "torch" in sys.modules, os.environ.get("OMP_WAIT_POLICY")
_spin = os.environ.get("GOMP_SPINCOUNT")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if _asked is None:
    OMP_WAIT_POLICY_IN_EFFECT = "default (torch imported before engine)" if _torch_first else "PASSIVE"
elif _asked.strip().upper() in ("PASSIVE", "ACTIVE"):
    OMP_WAIT_POLICY_IN_EFFECT = _asked.strip().upper()
else:  # libgomp ignores a value it does not know: its default, a bounded spin
    OMP_WAIT_POLICY_IN_EFFECT = f"default (OMP_WAIT_POLICY={_asked!r})"
if _spin and OMP_WAIT_POLICY_IN_EFFECT != "PASSIVE":  # libgomp honours the spin count only then
    OMP_WAIT_POLICY_IN_EFFECT += f", GOMP_SPINCOUNT={_spin}"

from engine.engine import Engine, ServingLimits  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.loader import ModelInfo  # noqa: E402
from engine.model import decode_one_token, prefill  # noqa: E402
from engine.results import GenerationResult, RequestMetrics, RequestOutput  # noqa: E402
from engine.settings import EngineSettings  # noqa: E402
from engine.trace import Metrics, StepRecord, Trace  # noqa: E402

__all__ = [
    "Engine",
    "EngineSettings",
    "EngineError",
    "OMP_WAIT_POLICY_IN_EFFECT",
    "GenerationResult",
    "Metrics",
    "ModelInfo",
    "RequestMetrics",
    "RequestOutput",
    "ServingLimits",
    "StepRecord",
    "Trace",
    "decode_one_token",
    "prefill",
]

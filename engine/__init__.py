"""Two-Pot Kitchen's inference engine: prefill (the wok) and decode (the soup pot), in plain PyTorch.

    from engine import Engine
    eng = Engine.load("assets/models/chef", device="cpu", dtype="float32")
    res = eng.generate(["ROMEO:"], max_new_tokens=32)

See docs/engine-api.md for the contract. This package never imports streamlit.
"""

from engine.engine import Engine, GenerationResult, decode_one_token, prefill
from engine.errors import EngineError
from engine.loader import ModelInfo
from engine.trace import Metrics, StepRecord, Trace

__all__ = [
    "Engine",
    "EngineError",
    "GenerationResult",
    "Metrics",
    "ModelInfo",
    "StepRecord",
    "Trace",
    "decode_one_token",
    "prefill",
]

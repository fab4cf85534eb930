"""What the main bench runs: token counts, repeats, and the refusal of impossible plans."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import EngineError

DEFAULT_MODEL = "preset:smollm2-135m"


@dataclass(frozen=True)
class BenchPlan:
    """What to run. Token counts are per sequence; `repeats` timed runs follow `warmup` untimed ones."""

    prefill_tokens: int = 512
    prefill_batch: int = 1  # prompts of prefill_tokens in the prefill pass (8 x 1024 makes a GPU compute-bound)
    decode_prompt_tokens: int = 64
    decode_tokens: int = 32
    big_batch: int = 32
    big_batch_prompt_tokens: int = 16
    repeats: int = 5
    warmup: int = 1
    compile: bool = False  # ours with compile=True (engine/compiled.py): the targets then judge the compiled step


FULL = BenchPlan(decode_prompt_tokens=128, decode_tokens=64, big_batch_prompt_tokens=32, repeats=5)
QUICK = BenchPlan(decode_prompt_tokens=32, decode_tokens=8, big_batch_prompt_tokens=8, repeats=3)


def validate(plan: BenchPlan) -> None:
    for name in ("prefill_tokens", "prefill_batch", "decode_prompt_tokens", "big_batch", "big_batch_prompt_tokens",
                 "repeats"):  # fmt: skip
        if getattr(plan, name) < 1:
            raise EngineError(f"{name.replace('_', ' ')} must be at least 1, got {getattr(plan, name)}")
    if plan.decode_tokens < 2:
        raise EngineError(f"decode tokens must be at least 2 to time a decode step, got {plan.decode_tokens}")
    if plan.warmup < 0:
        raise EngineError(f"warm-up runs cannot be negative, got {plan.warmup}")

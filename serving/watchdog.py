"""When a running engine counts as hung: the silence limits.

A child that is alive but silent (a deadlock, a wedged device) is the failure a dead pipe does not
show. While a job runs, the parent waits for the child's next message at most `Silence.limit_s()`
seconds: the larger of a floor (60 s) and 100x the time the child measured for one token at load,
times the tokens the longest silent stretch of this job may process (`stream`: the prompt pass;
`generate`: every token). Lab experiments (`run`) pace themselves, so they get a fixed 600 s. A
quick question gets 30 s: its answer is tokenizer work or arithmetic (milliseconds), answered by
the child's second thread even mid-order. `TWO_POT_SILENCE_S` replaces every fixed bound.

Example, the chef on a small CPU: one token 3.3 ms, a 32-token order: 100 x 3.3 ms x 32 = 10.6 s,
under the 60 s floor, so the limit is 60 s. Past the limit the parent kills the child and the job
fails with one line naming the limit (`hung_line`); the kitchen then starts a fresh child.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from serving.loop_messages import SILENCE_ENV, TEST_HANG_ENV

__all__ = ["SILENCE_ENV", "TEST_HANG_ENV", "Silence", "hung_line", "pass_tokens"]


@dataclass(frozen=True)
class Silence:
    """How long a running job may go without a message from the child before it counts as hung."""

    floor_s: float = 60.0  # never less than this
    per_token_steps: float = 100.0  # or this many times the measured one-token time, per token
    run_s: float = 600.0  # `run` (lab experiments): they pace themselves; a fixed bound
    quick_s: float = 30.0  # a quick question (limits, check, encode, decode)

    @classmethod
    def from_env(cls) -> Silence:
        """`TWO_POT_SILENCE_S` replaces every fixed bound (the floor, `run`'s and quick questions')."""
        floor = os.environ.get(SILENCE_ENV)
        return cls(floor_s=float(floor), run_s=float(floor), quick_s=float(floor)) if floor else cls()

    def limit_s(self, kind: str, args: tuple, kwargs: dict, token_s: float) -> float:
        """Seconds of silence allowed for one job. Example: stream, prompts of 32 tokens, one
        token measured at 3.3 ms: max(60, 100 x 0.0033 x 32) = 60 s."""
        if kind == "run":
            return self.run_s
        return max(self.floor_s, self.per_token_steps * token_s * pass_tokens(kind, args, kwargs))


def pass_tokens(kind: str, args: tuple, kwargs: dict) -> int:
    """Tokens the longest silent stretch of a job may process: the prompt pass for a stream (every
    later message follows one step), every token for a generate. Text prompts count one token per
    character (never fewer tokens than characters with the engine's tokenizers: a generous bound)."""
    prompts = args[0] if args else kwargs.get("prompts", [])
    prompt = sum(len(p) for p in prompts)
    if kind == "generate":
        new = args[1] if len(args) > 1 else kwargs.get("max_new_tokens", 64)  # Engine.generate's default
        return prompt + len(prompts) * new
    return max(prompt, len(prompts))


def hung_line(model: str, limit_s: float, waiting_for: str = "") -> str:
    """The one line a job (or a quick question) fails with when its child was stopped as hung."""
    what = f"no answer to {waiting_for}" if waiting_for else "nothing"
    return (
        f"the engine process for {model} sent {what} for {limit_s:,.0f} s (the limit "
        f"for {'a quick question' if waiting_for else 'this order'}) and was stopped as hung; "
        "the kitchen restarts it for the next order"
    )

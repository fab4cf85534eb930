"""Is a serving decode step as fast as the fixed-batch decode step at the same batch?

The serving path pays for its freedom (any sequence may join or leave at any step) with a little
bookkeeping per step: the scheduler's plan, the seats' write index, the per-row mask. This
measures whether that shows, end to end and wall-clock, the way a user feels it:

  fixed    (t(generate n tokens) - t(generate 1 token)) / (n - 1), the batch as one order
  order    the same order through `generate()`, which cooks it on seats (engine/order_run.py)
  serving  B requests submitted together, stepped until every one has its first token (prefill
           may take several steps under the token budget), then the wall time of the decode steps
           until they finish, divided by their number

Both sides run the same prompts (B x 40 tokens) and n new tokens, interleaved, median of repeats.
The fixed path is timed twice in each round (A/A): how far two runs of the same code differ is
the noise a serving / fixed ratio must be read against.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from engine.engine import Engine
from engine.events import Token
from engine.fixed_batch import FixedBatchRun
from engine.limits import RequestSettings


@dataclass(frozen=True)
class DecodeStepTiming:
    batch: int
    fixed_ms: float
    serving_ms: float
    fixed_again_ms: float  # the fixed path a second time in each round (A/A)
    order_ms: float  # the same order through generate(), which cooks it on seats (the Kitchen's path)

    @property
    def ratio(self) -> float:
        """serving / fixed: at most 1.0 means the serving step is no slower."""
        return self.serving_ms / self.fixed_ms

    @property
    def order_ratio(self) -> float:
        """order on seats / fixed: the Kitchen's order on the serving core against the fixed batch."""
        return self.order_ms / self.fixed_ms

    @property
    def aa_ratio(self) -> float:
        """fixed (second) / fixed: the same code against itself."""
        return self.fixed_again_ms / self.fixed_ms


def _generate_fixed(engine: Engine, prompts: list[list[int]], n: int) -> None:
    """The order through the fixed-batch path (generate() itself now cooks such an order on seats)."""
    req = RequestSettings(max_new_tokens=n, stop_at_eos=False)
    for _ in FixedBatchRun(engine.model, engine.codec, engine.info, prompts, req, 0).events():
        pass


def _generate_seats(engine: Engine, prompts: list[list[int]], n: int) -> None:
    engine.generate(prompts, max_new_tokens=n, stop_at_eos=False)


def _per_step(generate, engine: Engine, prompts: list[list[int]], n: int) -> float:
    """(t(n tokens) - t(1 token)) / (n - 1): one decode step, setup and prefill cancelled out."""
    t = time.perf_counter()
    generate(engine, prompts, 1)
    one = time.perf_counter() - t
    t = time.perf_counter()
    generate(engine, prompts, n)
    return (time.perf_counter() - t - one) / (n - 1)


def _fixed(engine: Engine, prompts: list[list[int]], n: int) -> float:
    return _per_step(_generate_fixed, engine, prompts, n)


def _serving(engine: Engine, prompts: list[list[int]], n: int) -> float:
    for p in prompts:
        engine.submit(p, n, stop_at_eos=False)
    first = 0
    while first < len(prompts):  # the prefill steps: not timed
        first += sum(isinstance(ev, Token) and ev.step == 0 for ev in engine.step())
    steps, t = 0, time.perf_counter()
    while not engine.idle:
        engine.step()
        steps += 1
    return (time.perf_counter() - t) / steps


def time_decode_step(engine: Engine, batch: int, new_tokens: int = 64, repeats: int = 5) -> DecodeStepTiming:
    """`engine` must use a policy that prefills all B prompts in one step (static or continuous)."""
    prompts = [[(7 * i + j) % engine.cfg.vocab_size for j in range(40)] for i in range(batch)]
    _fixed(engine, prompts, new_tokens), _serving(engine, prompts, new_tokens)  # warm-up, both paths
    _per_step(_generate_seats, engine, prompts, new_tokens)
    fixed, serving, again, order = [], [], [], []
    for _ in range(repeats):
        fixed.append(_fixed(engine, prompts, new_tokens))
        serving.append(_serving(engine, prompts, new_tokens))
        order.append(_per_step(_generate_seats, engine, prompts, new_tokens))
        again.append(_fixed(engine, prompts, new_tokens))
    med = statistics.median
    return DecodeStepTiming(batch, med(fixed) * 1e3, med(serving) * 1e3, med(again) * 1e3, med(order) * 1e3)

"""What a learner orders, the limits on it, and the job that carries it to the kitchen.

Why here and not in the page: the limits ("why can't I pick batch 64?") are arithmetic on the
model's context and the KV budget, and the order becomes the form its host checks (the host's
engine owns the tokenizer), so both must be testable without a browser.

Worked example, the chef (context 512) with max_new_tokens 64: a prompt may be at most
512 - 64 = 448 tokens; with a 2 MB KV budget, 12,288 KV bytes per token and prompt 100,
one table needs (100 + 64) x 12,288 = 2.0 MB, so the largest batch is 1 and the reason says so.
The engine computes those numbers (`Engine.limits`) and refuses anything beyond them
(`Engine.check`); this module only turns them into slider ceilings and sentences.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.host.api import OrderForm

MAX_TABLES = 64  # the batch slider's ceiling even when memory would allow more
DEFAULT_PROMPT = "ROMEO:\nO, she doth teach the torches to burn bright!\n"

# The generated prompt's source: our own lines in the plays' manner (the chef knows this style).
# Each table starts at a different line, so a batch holds different orders of the same length.
FILLER = (
    "FIRST COOK:\nBring forth the pans, for guests are at the door,\nand every table calls for bread and wine.\n"
    "SECOND COOK:\nThe soup is warm; I'll ladle as they ask,\none bowl, then one, then one, until they're fed.\n"
    "FIRST COOK:\nThe wok is hot; toss all the greens at once,\nand send them on before the fire fades.\n"
    "STEWARD:\nMy lords, the feast is laid, the hall is full;\nsit down, and let the kitchen do its work.\n"
)


@dataclass(frozen=True)
class ControlLimits:
    """What the controls allow for this model, and the one-line reason behind each ceiling."""

    max_context: int
    max_new_tokens: int  # for a one-token prompt
    max_prompt_tokens: int  # given the chosen max_new_tokens
    max_batch: int  # given the prompt length and max_new_tokens
    batch_reason: str
    prompt_reason: str


def control_limits(engine_limits, prompt_tokens: int, max_new: int) -> ControlLimits:
    """The controls' ceilings from the engine's own `limits()` (context and KV budget).

    `engine_limits` is what `Engine.limits(prompt_tokens, max_new)` returns: the engine decides
    what it will accept, this only words it for the sliders.
    """
    lim = engine_limits
    per_table = lim.kv_bytes_per_sequence
    if lim.max_batch < MAX_TABLES:
        batch_reason = (
            f"each table's KV cache ({prompt_tokens:,} + {max_new:,} tokens) needs {per_table / 1e6:,.2f} MB "
            f"and the KV budget is {lim.kv_budget_bytes / 1e6:,.0f} MB"
        )
    else:
        batch_reason = (
            f"the kitchen seats at most {MAX_TABLES} tables (the memory free now would allow about "
            f"{rounded_down(lim.max_batch):,}; that depends on what else this machine is running)"
        )
    return ControlLimits(
        max_context=lim.max_context,
        max_new_tokens=max(1, lim.max_context - 1),
        max_prompt_tokens=max(1, lim.max_context - max_new),
        max_batch=max(1, min(MAX_TABLES, lim.max_batch)),
        batch_reason=batch_reason,
        prompt_reason=f"the model's context is {lim.max_context:,} tokens and {max_new:,} are kept for the reply",
    )


def rounded_down(n: int) -> int:
    """Two significant figures, rounded down, so a figure that follows free memory does not change
    on every rerun. Example: 19,331 / 19,307 / 19,051 -> 19,000; 987 -> 980; 64 -> 64."""
    if n < 100:
        return n
    unit = 10 ** (len(str(n)) - 2)
    return n // unit * unit


def _fits(limits_fn, prompt_tokens: int, max_new: int) -> bool:
    return limits_fn(prompt_tokens, max_new).max_batch >= 1


def reply_ceiling(limits_fn, max_context: int) -> tuple[int, str]:
    """The most new tokens one table of a one-token prompt can order, and why.

    `limits_fn` is `Engine.limits` (or the service's). The context usually decides; on a big model
    with a small KV budget one table's cache decides, and the control must not offer more.
    Example: context 512, everything fits -> (511, "the model's context is 512 tokens ...").
    """
    ceiling = max(1, max_context - 1)
    fit = _largest(lambda n: _fits(limits_fn, 1, n), 1, ceiling)
    if fit == ceiling:
        return ceiling, f"the model's context is {max_context:,} tokens and the prompt needs at least one"
    budget = limits_fn(1, fit).kv_budget_bytes
    return fit, f"one table's KV cache for more would not fit the KV budget ({budget / 1e6:,.0f} MB)"


def prompt_ceiling(limits_fn, max_context: int, max_new: int) -> tuple[int, str]:
    """The longest prompt one table can order with `max_new` new tokens, and why.

    Example (Llama-3.2-1B: context 131,072, a KV budget of a few GB): the context alone would allow
    131,008 tokens, but one table's cache fits only a fraction of that, so the slider stops there
    instead of offering orders the engine would refuse with "at most 0 sequences".
    """
    ceiling = max(1, max_context - max_new)
    fit = _largest(lambda n: _fits(limits_fn, n, max_new), 1, ceiling)
    if fit == ceiling:
        return (
            ceiling,
            f"the model's context is {max_context:,} tokens and {max_new:,} are kept for the reply",
        )
    budget = limits_fn(fit, max_new).kv_budget_bytes
    return fit, (
        f"one table's KV cache for a longer prompt plus {max_new:,} new tokens would not fit "
        f"the KV budget ({budget / 1e6:,.0f} MB, a share of the memory free now)"
    )


def tighter(cap: int, reason: str, other: int | None, other_reason: str) -> tuple[int, str]:
    """The lower of two ceilings with its own reason (an instructor's cap against the engine's limit).
    Example: tighter(448, "the model's context ...", 256, "the instructor's limit ...") -> (256, "the instructor's ...")."""
    if other is not None and other < cap:
        return max(1, other), other_reason
    return cap, reason


def _largest(fits, low: int, high: int) -> int:
    """The largest n in [low, high] with fits(n), for a monotone fits (true, then false); low if none."""
    if fits(high):
        return high
    if not fits(low):
        return low
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


@dataclass(frozen=True)
class Order:
    """One Cook: either a written prompt, or a generated prompt of `prompt_tokens` tokens."""

    batch: int
    max_new_tokens: int
    temperature: float
    seed: int
    text: str | None = None  # every table orders this text
    prompt_tokens: int | None = None  # or: each table gets this many tokens of FILLER
    reuse_prefix: bool = False  # start from leftovers a cached prefix holds (the Leftovers lesson); off: cook every token

    def form(self) -> OrderForm:
        """The order as the kitchen's host checks it: the written text for every table, or `batch`
        generated prompts the engine cuts from FILLER (serving/host/api.py `generated_prompts`)."""
        settings = {"temperature": self.temperature, "seed": self.seed, "reuse_prefix": self.reuse_prefix}
        if self.text is not None:
            return OrderForm([self.text] * self.batch, self.max_new_tokens, settings)
        return OrderForm([], self.max_new_tokens, settings, FILLER, self.batch, self.prompt_tokens or 1)

    @property
    def label(self) -> str:
        size = f"{self.prompt_tokens} tokens" if self.text is None else f"{len(self.text)} chars"
        return f"cook {self.batch} table(s), prompt {size}, {self.max_new_tokens} new"

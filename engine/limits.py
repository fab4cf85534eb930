"""Refusing bad requests before any work starts: one readable line naming the problem and the limit.

Why check up front: a prompt that is too long would otherwise fail deep inside a RoPE table lookup,
and an oversized batch would try to allocate the KV cache and take the machine down with it. What a
request needs is known before allocating: its KV cache, batch x (prompt + new tokens) x bytes per
token, plus the working memory of its prefill pass (activations and attention scores,
engine/costs.py `prefill_work_bytes`), which for long prompts is the larger of the two.

Worked example: SmolLM2-135M in float32 stores 46,080 B per token; 64 sequences x (512 + 512)
tokens need 64 x 1,024 x 46,080 = 3.0 GB of KV cache, and each 512-token prompt's prefill needs
17.3 MB of activations + 9.4 MB of scores + 0.2 MB of logits: 1.7 GB more for 64. With a 2 GB
budget the request is refused and `limits(512, 512).max_batch` says 26 would fit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import psutil
import torch

from engine.config import ModelConfig
from engine.costs import prefill_work_bytes
from engine.errors import EngineError
from engine.sampling import SamplingParams
from engine.speculative import MAX_SPECULATE

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's own limit)
DEFAULT_BUDGET_FRACTION = 0.5  # of the memory available when the request is checked


@dataclass(frozen=True)
class RequestSettings:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_at_eos: bool = True
    cuda_graph: bool = False
    native: bool = True  # an order's decode steps through the native step where it runs (engine/native.py)
    speculate: int = 0  # draft tokens per decode step (serving path only; engine/speculative.py)
    draft: str = "ngram"
    reuse_prefix: bool = True  # serving path: start from a cached prompt prefix when one matches
    logprobs: int = -1  # serving path: -1 none; k >= 0: each token's log-probability and its k likeliest rivals
    min_tokens: int = 0  # serving path: EOS cannot end the request before this many new tokens

    def __init__(self, **kwargs):
        known = {f.name for f in fields(self)}
        for key in kwargs:
            if key not in known:
                raise EngineError(f"unknown setting '{key}' (known: {', '.join(sorted(known))})")
        for f in fields(self):
            object.__setattr__(self, f.name, kwargs.get(f.name, f.default))


@dataclass(frozen=True)
class Limits:
    max_batch: int  # sequences whose KV cache and prefill working memory fit in the budget
    max_context: int  # prompt + new tokens may not exceed this
    kv_budget_bytes: int  # the memory budget: KV cache + prefill working memory
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    work_bytes_per_sequence: int = 0  # prefill working memory of one sequence of this prompt length

    @property
    def bytes_per_sequence(self) -> int:
        return self.kv_bytes_per_sequence + self.work_bytes_per_sequence


def available_memory(device: torch.device) -> int:
    """Free bytes now: CUDA free memory, or on CPU what the OS can give without swapping (psutil's
    `available`: MemAvailable on Linux, free + inactive pages on macOS, available physical memory on Windows)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def kv_limits(cfg: ModelConfig, dtype, device, budget: int | None, prompt_len: int, max_new: int) -> Limits:
    if budget is None:
        budget = int(available_memory(torch.device(device)) * DEFAULT_BUDGET_FRACTION)
    per_token = cfg.kv_bytes_per_token(dtype.itemsize)
    per_seq = per_token * max(prompt_len + max_new, 1)
    work = prefill_work_bytes(cfg, prompt_len, prompt_len, dtype.itemsize)
    return Limits(budget // (per_seq + work), cfg.max_context, budget, per_token, per_seq, work)


def check_request(cfg: ModelConfig, prompts: list[list[int]], req: RequestSettings, limits: Limits) -> None:
    """Raise EngineError for the first problem found; return None when the request is fine."""
    if not prompts:
        raise EngineError("no prompts given: pass at least one prompt")
    if not isinstance(req.max_new_tokens, int) or req.max_new_tokens < 1:
        raise EngineError(f"max_new_tokens must be at least 1 (got {req.max_new_tokens})")
    if not isinstance(req.native, bool):
        raise EngineError(f"native must be True or False (got {req.native!r})")
    SamplingParams(req.temperature, req.top_k, req.top_p).check()
    if not isinstance(req.speculate, int) or not 0 <= req.speculate <= MAX_SPECULATE:
        raise EngineError(f"speculate must be 0..{MAX_SPECULATE} draft tokens per step (got {req.speculate})")
    if not isinstance(req.draft, str) or not req.draft:
        raise EngineError(f"draft must be 'ngram' (prompt lookup), 'apprentice' or a model name/folder (got {req.draft!r})")
    if not isinstance(req.logprobs, int) or not -1 <= req.logprobs <= MAX_LOGPROBS:
        raise EngineError(f"logprobs must be -1 (none) or 0..{MAX_LOGPROBS} alternatives per token (got {req.logprobs})")
    if not isinstance(req.min_tokens, int) or not 0 <= req.min_tokens <= req.max_new_tokens:
        raise EngineError(f"min_tokens must be 0..max_new_tokens ({req.max_new_tokens}) (got {req.min_tokens})")
    for i, ids in enumerate(prompts, start=1):
        if not ids:
            raise EngineError(f"prompt {i} is empty: give at least one token")
        bad = next((t for t in ids if not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            raise EngineError(
                f"prompt {i} has token id {bad}; the vocabulary has {cfg.vocab_size:,} ids (0..{cfg.vocab_size - 1:,})"
            )
        if len(ids) > cfg.max_context:
            raise EngineError(
                f"prompt {i} is {len(ids):,} tokens; the model's context is {cfg.max_context:,}"
            )
        if len(ids) + req.max_new_tokens > cfg.max_context:
            raise EngineError(
                f"prompt {i} ({len(ids):,} tokens) + max_new_tokens {req.max_new_tokens:,} = "
                f"{len(ids) + req.max_new_tokens:,} exceeds the model's context of {cfg.max_context:,} tokens"
            )
    kv = len(prompts) * limits.kv_bytes_per_sequence
    work = len(prompts) * limits.work_bytes_per_sequence
    if kv + work > limits.kv_budget_bytes:
        raise EngineError(
            f"batch {len(prompts)} x {limits.kv_bytes_per_sequence // limits.kv_bytes_per_token:,} tokens needs "
            f"{kv:,} bytes of KV cache + {work:,} bytes of prefill working memory = {kv + work:,} bytes; "
            f"the budget is {limits.kv_budget_bytes:,} bytes (at most {limits.max_batch} sequences of this length)"
        )

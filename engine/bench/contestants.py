"""The two contestants of the main bench, HF and our engine, on the same weights, and how one run
of each is timed (one clock, the caller's, synchronised on GPU). engine/bench/bench.py and its siblings share these."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from engine import OMP_WAIT_POLICY_IN_EFFECT, Engine
from engine.bench.roofline import synchronize
from engine.events import Done, Token
from engine.loader import parse_device, parse_dtype, resolve_source
from engine.presets import PRESETS, preset_config


@dataclass
class Samples:
    """Every timed value kept, so the JSON shows the spread and not just the median."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0

    def to_dict(self) -> dict:
        return {"median": self.median, "min": min(self.values, default=0.0), "samples": self.values}


# ---------------------------------------------------------------- shared weights


@dataclass
class Contestants:
    engine: object  # engine.Engine, loaded from `folder`
    hf: torch.nn.Module  # transformers model holding the same tensors
    folder: str
    weight_read_bytes: int  # bytes one decode step must read: every weight, LM head once
    vocab_size: int


def reference_folder(model: str, workdir: str) -> str:
    """The HF folder both sides load. A `preset:NAME` is built here with random weights and saved.

    The preset's config.json (engine.presets) becomes a transformers model, randomly initialised
    (seed 0), saved to `workdir`: the same loading path as any checkpoint. Any other model is
    already a folder (or a catalog name / hub id that resolves to one) and is used as it is.
    """

    source = resolve_source(model)
    if not source.startswith("preset:"):
        return source


    name = source.removeprefix("preset:")
    preset_config(name)  # unknown names are refused here, in one line
    raw = dict(PRESETS[name])
    config = AutoConfig.for_model(
        raw.pop("model_type"), **{k: v for k, v in raw.items() if k != "architectures"}
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(workdir)
    return workdir


def weight_read_bytes(hf: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: all parameters, a tied matrix once.

    An untied input embedding is only gathered (a few rows per step), so it is left out.
    """
    params = {p.data_ptr(): p for p in hf.parameters()}
    total = sum(p.numel() * p.element_size() for p in params.values())
    embed = hf.get_input_embeddings().weight
    head = hf.get_output_embeddings()
    if head is None or head.weight.data_ptr() != embed.data_ptr():
        total -= embed.numel() * embed.element_size()
    return total


def load_contestants(model: str, device: str, dtype: str, workdir: str, compile: bool = False) -> Contestants:
    """Both sides from one folder: HF via `from_pretrained`, ours via `Engine.load` (`compile`: its
    decode steps compiled, engine/compiled.py; the warm-up run pays the compile)."""


    hf_logging.disable_progress_bar()

    dev, tdtype = parse_device(device), parse_dtype(dtype)
    folder = reference_folder(model, workdir)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=tdtype).to(dev).eval()
    eng = Engine.load(folder, device=device, dtype=dtype, compile=compile)
    return Contestants(eng, hf, folder, weight_read_bytes(hf), hf.config.vocab_size)


# ---------------------------------------------------------------- timing one run of each side


def random_prompts(vocab_size: int, batch: int, length: int, seed: int) -> list[list[int]]:
    """Token ids, not text: both sides see identical inputs with no tokenizer in the timing."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (batch, length), generator=gen)  # (B, T); skip special ids
    return ids.tolist()


@dataclass
class Run:
    """One greedy run of n tokens per sequence, timed from the caller's side with one clock.

    `token_times[i]`: seconds from the call until step i's tokens reached the caller (step 0 is
    the token sampled from prefill's logits). TPOT is then the span between the first and last
    token over the n - 1 steps between them: one run, no subtraction of two noisy runs. Example:
    token_times [0.020, 0.025, 0.031, 0.035] -> TTFT 20 ms, TPOT (35 - 20) / 3 = 5 ms.
    """

    wall_s: float
    token_times: list[float]
    tokens: list[list[int]]  # (B, n) the generated ids
    result: object = None  # ours: the engine's GenerationResult (its own per-token metrics)

    @property
    def ttft_s(self) -> float:
        return self.token_times[0]

    @property
    def tpot_s(self) -> float:
        n = len(self.token_times)
        if n < 2:
            raise ValueError("TPOT needs at least 2 tokens per sequence")
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)


class _Stamps:
    """A `generate` streamer that keeps when each step's tokens came out (its `put` gets the
    prompt first, then each step's (B,) tokens, already copied to the CPU)."""

    def __init__(self, t0: float):
        self.t0, self.times, self.prompt_seen = t0, [], False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter() - self.t0)
        self.prompt_seen = True

    def end(self) -> None:
        pass


def run_hf(hf: torch.nn.Module, prompts: list[list[int]], n: int, device: torch.device) -> Run:
    """One greedy HF `generate` making exactly n tokens per sequence."""
    ids = torch.tensor(prompts, device=device)  # (B, T), equal lengths: no padding
    mask = torch.ones_like(ids)
    synchronize(device)
    t0 = time.perf_counter()
    stamps = _Stamps(t0)
    out = hf.generate(
        ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
        streamer=stamps,
    )  # fmt: skip
    synchronize(device)
    wall = time.perf_counter() - t0
    return Run(wall, stamps.times, out[:, ids.shape[1] :].tolist())


def run_ours(eng, prompts: list[list[int]], n: int, device: torch.device, cuda_graph: bool = False) -> Run:
    """One greedy engine request of n tokens per sequence, its tokens timed as they stream out."""
    synchronize(device)
    t0 = time.perf_counter()
    times, result = [], None
    for ev in eng.stream(prompts, max_new_tokens=n, temperature=0.0, stop_at_eos=False, cuda_graph=cuda_graph):
        if isinstance(ev, Token) and ev.step == len(times):
            times.append(time.perf_counter() - t0)
        elif isinstance(ev, Done):
            result = ev.result
    synchronize(device)
    return Run(time.perf_counter() - t0, times, result.tokens, result)


# ---------------------------------------------------------------- the three scenarios


def alternate(i: int, first, second) -> tuple:
    """Both results, (first(), second()), but run in swapped order on odd repeats so neither side
    always gets the warmer caches or the quieter moment."""
    if i % 2 == 0:
        a = first()
        return a, second()
    b = second()
    return first(), b


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def cpu_name() -> str:
    """The CPU's model name: Linux lists it in /proc/cpuinfo; elsewhere what `platform` knows."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as f:
                return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict:
    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        # Threading knobs change decode speed a lot on shared cores (engine/__init__.py explains).
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        # The variable above is only what it says once torch is loaded: this is what OpenMP does.
        "omp_wait_policy_in_effect": OMP_WAIT_POLICY_IN_EFFECT,
    }

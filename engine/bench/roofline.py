"""The roofline: the two ceilings of this machine, measured here and now.

Every forward pass needs some FLOPs and moves some bytes. Its speed is capped by whichever of the
two roofs it hits first:

    attainable FLOP/s = min(peak FLOP/s, bandwidth x intensity),   intensity = FLOPs / bytes moved

The *ridge* is the intensity where the two roofs meet (peak FLOP/s / bandwidth). Below it a step
is memory-bound (the soup pot: decode reads every weight to make one token per sequence); above
it, compute-bound (the wok: prefill reuses each weight across hundreds of prompt tokens).
Worked example with this CPU kind's figures: 130 GFLOP/s / 29 GB/s = ridge at 4.5 FLOP/byte. A
batch-1 fp32 decode step does ~2 FLOPs per 4-byte weight = 0.5 FLOP/byte, far left of the ridge,
so it can reach at most 0.5 x 29 = 14.5 GFLOP/s; only bandwidth makes it faster.

Why measure instead of reading a spec sheet: the machine is shared, virtualised and
thread-limited, so only a number taken in the same run as the benchmark is a fair yardstick.
Two traps this module avoids on purpose:
  * Untouched memory. `torch.empty` pages are never written, so the OS maps them all to one
    shared zero page and "reading" 500 MB hits the cache (~190 GB/s here: wrong). We fill the
    buffer first, so every page is real.
  * Cache-sized buffers. A buffer that fits in the last-level cache measures the cache, not DRAM.
    The default buffer (512 MiB on CPU) is the size of a small model's weights, the working set
    decode really streams each step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.errors import EngineError
from engine.loader import CANONICAL_DTYPE, parse_device, parse_dtype

MiB = 2**20
CPU_BUFFER_BYTES = 512 * MiB  # about one SmolLM2-135M in fp32 (538 MB)
CUDA_BUFFER_BYTES = 2048 * MiB  # far above any GPU's L2 (H100/H200: 50 MB)
CPU_GEMM_SIZES = {True: (1024,), False: (1024, 2048)}  # keyed by `quick`
CUDA_GEMM_SIZES = {True: (4096,), False: (4096, 8192)}


@dataclass(frozen=True)
class Roofline:
    """Measured ceilings: bytes/s read from memory and FLOP/s of a large matrix multiply."""

    bandwidth_bytes_per_s: float
    flops_per_s: float
    device: str
    dtype: str
    details: dict = field(default_factory=dict)

    @property
    def ridge(self) -> float:
        """FLOP per byte where compute and memory roofs meet; left of it, a step is memory-bound."""
        return self.flops_per_s / self.bandwidth_bytes_per_s

    def attainable(self, intensity: float) -> float:
        """The most FLOP/s a pass of this intensity (FLOP/byte) can reach on this machine."""
        return min(self.flops_per_s, self.bandwidth_bytes_per_s * max(intensity, 0.0))

    def to_dict(self) -> dict:
        return asdict(self) | {"ridge_flop_per_byte": self.ridge}


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU kernels, so a timer measures the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of `repeats` calls of `fn` after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def last_level_cache_bytes() -> int | None:
    """The CPU's largest cache as Linux reports it (a VM may report the whole socket's)."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def measure_read_bandwidth(device: torch.device, buffer_bytes: int, repeats: int) -> dict:
    """Bytes/s of `x.sum()` over a filled fp32 buffer: one streaming read of every byte.

    fp32 on purpose, whatever the model's dtype: bytes are bytes to DRAM, and the fp32 reduction
    is the fastest (bf16/fp16 sums convert each element and can become compute-bound on CPU).
    """
    n = max(buffer_bytes // 4, 1)
    x = torch.ones(n, dtype=torch.float32, device=device)  # written, so every page is real
    times = time_runs(lambda: x.sum(), device, repeats)
    med = statistics.median(times)
    nbytes = x.numel() * x.element_size()
    return {
        "method": "x.sum() over a filled fp32 buffer",
        "buffer_bytes": nbytes,
        "times_s": times,
        "median_s": med,
        "bytes_per_s": nbytes / med,
    }


def measure_gemm_flops(
    device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...], repeats: int
) -> dict:
    """FLOP/s of square matmuls (2 n^3 FLOPs each); the roof is the best size's median."""
    per_size = {}
    for n in sizes:
        gen = torch.Generator(device=device).manual_seed(n)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)  # (n, n)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)  # (n, n)
        times = time_runs(lambda a=a, b=b: a @ b, device, repeats)
        med = statistics.median(times)
        per_size[str(n)] = {"times_s": times, "median_s": med, "flops_per_s": 2 * n**3 / med}
    best = max(per_size.values(), key=lambda r: r["flops_per_s"])["flops_per_s"]
    return {"method": "a @ b, square, median per size, best size", "sizes": per_size, "flops_per_s": best}


def measure_roofline(
    device: str = "cpu",
    dtype: str = "float32",
    quick: bool = True,
    *,
    buffer_bytes: int | None = None,
    gemm_sizes: tuple[int, ...] | None = None,
) -> Roofline:
    """Measure both roofs now, on this device, with this many threads.

    `quick` uses fewer repeats and one GEMM size (about a second on a 2-core CPU). `buffer_bytes`
    and `gemm_sizes` override the defaults (tests use small ones; small buffers measure cache).
    """
    dev = parse_device(device)
    tdtype = parse_dtype(dtype)
    on_gpu = dev.type == "cuda"
    if buffer_bytes is None:
        buffer_bytes = CUDA_BUFFER_BYTES if on_gpu else CPU_BUFFER_BYTES
    if buffer_bytes <= 0:
        raise EngineError(f"bandwidth buffer must be positive, got {buffer_bytes} bytes")
    if gemm_sizes is None:
        gemm_sizes = (CUDA_GEMM_SIZES if on_gpu else CPU_GEMM_SIZES)[quick]
    if not gemm_sizes or min(gemm_sizes) <= 0:
        raise EngineError(f"GEMM sizes must be positive, got {gemm_sizes}")
    repeats = 5 if quick else 11

    with torch.inference_mode():
        bw = measure_read_bandwidth(dev, buffer_bytes, repeats)
        mm = measure_gemm_flops(dev, tdtype, tuple(gemm_sizes), repeats)
    details = {
        "bandwidth": bw,
        "gemm": mm,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "quick": quick,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev) if on_gpu else "cpu",
        "last_level_cache_bytes": None if on_gpu else last_level_cache_bytes(),
    }
    return Roofline(
        bandwidth_bytes_per_s=bw["bytes_per_s"],
        flops_per_s=mm["flops_per_s"],
        device=str(dev),
        dtype=CANONICAL_DTYPE[tdtype],
        details=details,
    )


def best_roof(roofs: list[Roofline]) -> Roofline:
    """The highest bandwidth and the highest FLOP/s seen: a ceiling is what the machine *can* do."""
    if len(roofs) == 1:
        return roofs[0]
    return Roofline(
        bandwidth_bytes_per_s=max(r.bandwidth_bytes_per_s for r in roofs),
        flops_per_s=max(r.flops_per_s for r in roofs),
        device=roofs[0].device,
        dtype=roofs[0].dtype,
        details={
            "rule": "best of each roof over the measurements below",
            "bandwidths_bytes_per_s": [r.bandwidth_bytes_per_s for r in roofs],
            "flops_per_s": [r.flops_per_s for r in roofs],
            "measurements": [r.details for r in roofs],
        },
    )

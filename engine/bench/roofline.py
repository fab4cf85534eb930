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
Each roof is its fastest repeat, not the median: a ceiling is what the machine can do, and on
shared cores a slower repeat measured a neighbour's work too (a median roof let the wok's own
passes beat the compute roof it was measured against).
Two traps this module avoids on purpose:
  * Untouched memory. `torch.empty` pages are never written, so the OS maps them all to one
    shared zero page and "reading" 500 MB hits the cache (~190 GB/s here: wrong). We fill the
    buffer first, so every page is real.
  * Cache-sized buffers. A buffer that fits in the last-level cache measures the cache, not DRAM.
    The default buffer (512 MiB on CPU) is the size of a small model's weights, the working set
    decode really streams each step.

A roof per memory level. A model whose weights fit in a cache (the chef's 20 MB in a 32 MB L3)
reads them from there, faster than DRAM allows, so on CPU the caches' roofs are measured too
(`bench.cache_probe`: L2 and the last-level cache, with buffers sized from what the machine
reports). Each pass then sits under the roof of the smallest level its bytes fit in (`home`):
    the chef's decode step, 19 MB -> the L3 roof; the assistant's, 538 MB -> the DRAM roof.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from engine.bench.cache_probe import Reader, measure_cache_reads, probe_library
from engine.errors import EngineError
from engine.loader import CANONICAL_DTYPE, parse_device, parse_dtype

MiB = 2**20
CPU_BUFFER_BYTES = 512 * MiB  # about one SmolLM2-135M in fp32 (538 MB)
CUDA_BUFFER_BYTES = 2048 * MiB  # far above any GPU's L2 (H100/H200: 50 MB)
CPU_GEMM_SIZES = {True: (1024,), False: (1024, 2048)}  # keyed by `quick`
CUDA_GEMM_SIZES = {True: (4096,), False: (4096, 8192)}


@dataclass(frozen=True)
class MemoryRoof:
    """One level of memory as a roof: how fast these threads read it, and how much it holds."""

    name: str  # "L2", "L3", "DRAM"
    bandwidth_bytes_per_s: float
    capacity_bytes: int | None = None  # what the engine's threads can keep there; None: DRAM (everything)

    def fits(self, nbytes: float) -> bool:
        return self.capacity_bytes is None or nbytes <= self.capacity_bytes


@dataclass(frozen=True)
class Roofline:
    """Measured ceilings: bytes/s read from memory (DRAM, and each cache level on CPU) and FLOP/s of
    a large matrix multiply. `bandwidth_bytes_per_s` is DRAM's; `caches` the faster levels'."""

    bandwidth_bytes_per_s: float
    flops_per_s: float
    device: str
    dtype: str
    details: dict = field(default_factory=dict)
    caches: tuple[MemoryRoof, ...] = ()  # smallest first (L2, L3); empty on GPU or where not measured
    cache_notes: tuple[str, ...] = ()  # one line per cache level that could not be measured, and why

    @property
    def ridge(self) -> float:
        """FLOP per byte where compute and the DRAM roof meet; left of it, a step is memory-bound."""
        return self.flops_per_s / self.bandwidth_bytes_per_s

    def attainable(self, intensity: float, memory: MemoryRoof | None = None) -> float:
        """The most FLOP/s a pass of this intensity (FLOP/byte) can reach on this machine, its bytes
        coming from `memory` (default DRAM)."""
        bandwidth = memory.bandwidth_bytes_per_s if memory is not None else self.bandwidth_bytes_per_s
        return min(self.flops_per_s, bandwidth * max(intensity, 0.0))

    @property
    def dram(self) -> MemoryRoof:
        return MemoryRoof("DRAM", self.bandwidth_bytes_per_s, None)

    def memory_roofs(self) -> tuple[MemoryRoof, ...]:
        """Every memory level measured, smallest (fastest) first, DRAM last."""
        return (*sorted(self.caches, key=lambda m: m.capacity_bytes or 0), self.dram)

    def home(self, nbytes: float) -> MemoryRoof:
        """The roof a pass that reads `nbytes` sits under: the smallest level they fit in.
        Example: 19 MB with a 32 MB L3 measured -> the L3 roof; 538 MB -> DRAM."""
        return next(m for m in self.memory_roofs() if m.fits(nbytes))

    def ridge_of(self, memory: MemoryRoof) -> float:
        """Where that level's roof meets the compute roof (FLOP/byte)."""
        return self.flops_per_s / memory.bandwidth_bytes_per_s

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


def measure_read_bandwidth(device: torch.device, buffer_bytes: int, repeats: int) -> dict:
    """Bytes/s of one streaming read of every byte of a filled buffer, the fastest repeat.

    On CPU the reader is the caches' C probe (engine/bench/cache_probe.c: a plain summing loop, one
    slice per thread), the same loop that measures L2 and L3, so every level is read alike. Not
    torch's `x.sum()`: its float reduction costs arithmetic per element, and one thread of it read
    DRAM a quarter slower than the probe and than the engine's own decode step, which then sat above
    the "roof". The sum stays the reader on GPUs and where no C compiler builds the probe (fp32: the
    fastest reduction; bf16/fp16 sums convert each element).
    On CPU the buffer is read by one thread and by all the engine's threads, and the faster is the
    roof: the split is even, so when a neighbour holds one core it waits for the thread sharing it,
    while one thread alone still reads at full speed (docs/benchmarks/decisions.md, "The roofs").
    """
    everyone = torch.get_num_threads()
    lib = probe_library() if device.type == "cpu" else "a GPU is read by torch"
    by_threads = {}
    if isinstance(lib, str):
        x = torch.ones(max(buffer_bytes // 4, 1), dtype=torch.float32, device=device)  # written: every page is real
        nbytes = per_call = x.numel() * x.element_size()  # one read of the buffer per call
        method = "x.sum() over a filled fp32 buffer" + (f" ({lib})" if device.type == "cpu" else "")
        try:
            for threads in sorted({1, everyone}) if device.type == "cpu" else [everyone]:
                torch.set_num_threads(threads)
                by_threads[str(threads)] = (time_runs(lambda: x.sum(), device, repeats), nbytes, per_call)
        finally:
            torch.set_num_threads(everyone)
    else:
        method = "the C probe (engine/bench/cache_probe.c) summing a filled buffer"
        for threads in sorted({1, everyone}):
            reader = Reader.make(buffer_bytes, threads)  # written: every page is real
            reader.call()  # warm-up
            by_threads[str(threads)] = ([reader.call() for _ in range(repeats)], reader.words.nbytes,
                                        reader.bytes_per_call)  # the buffer, read `passes` times per call
    reads = {t: {"times_s": times, "median_s": statistics.median(times), "best_s": min(times), "buffer_bytes": nbytes,
                 "bytes_per_call": per_call, "bytes_per_s": per_call / min(times)}
             for t, (times, nbytes, per_call) in by_threads.items()}  # fmt: skip
    fastest = max(reads, key=lambda t: reads[t]["bytes_per_s"])
    counts = ", fastest repeat of one thread and of all threads" if device.type == "cpu" else ", fastest repeat"
    return {"method": method + counts, "threads": int(fastest),
            "by_threads": reads, **reads[fastest]}


def measure_gemm_flops(
    device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...], repeats: int
) -> dict:
    """FLOP/s of square matmuls (2 n^3 FLOPs each); the roof is the best size's fastest repeat."""
    per_size = {}
    for n in sizes:
        gen = torch.Generator(device=device).manual_seed(n)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)  # (n, n)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)  # (n, n)
        times = time_runs(lambda a=a, b=b: a @ b, device, repeats)
        per_size[str(n)] = {"times_s": times, "median_s": statistics.median(times), "best_s": min(times),
                            "flops_per_s": 2 * n**3 / min(times)}  # fmt: skip
    best = max(per_size.values(), key=lambda r: r["flops_per_s"])["flops_per_s"]
    return {"method": "a @ b, square, fastest repeat per size, best size", "sizes": per_size, "flops_per_s": best}


def measure_roofline(
    device: str = "cpu",
    dtype: str = "float32",
    quick: bool = True,
    *,
    buffer_bytes: int | None = None,
    gemm_sizes: tuple[int, ...] | None = None,
    caches: bool = True,
) -> Roofline:
    """Measure the roofs now, on this device, with this many threads.

    `quick` uses fewer repeats and one GEMM size (about a second on a 2-core CPU). `buffer_bytes`
    and `gemm_sizes` override the defaults (tests use small ones; small buffers measure cache).
    `caches` adds the cache levels' roofs on CPU (`bench.cache_probe`, about 0.1 s).
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
    reads, notes = [], []
    if on_gpu:
        notes = ["the GPU's L2 is not measured here: only its memory roof is drawn"]
    elif caches:
        reads, notes = measure_cache_reads(torch.get_num_threads(), repeats)
    details = {
        "bandwidth": bw,
        "gemm": mm,
        "caches": [asdict(r) for r in reads],
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "quick": quick,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev) if on_gpu else "cpu",
    }
    return Roofline(
        bandwidth_bytes_per_s=bw["bytes_per_s"],
        flops_per_s=mm["flops_per_s"],
        device=str(dev),
        dtype=CANONICAL_DTYPE[tdtype],
        details=details,
        caches=tuple(MemoryRoof(r.name, r.bandwidth_bytes_per_s, r.capacity_bytes) for r in reads),
        cache_notes=tuple(notes),
    )


def best_roof(roofs: list[Roofline]) -> Roofline:
    """The highest bandwidth of each level and the highest FLOP/s seen: a ceiling is what the
    machine *can* do."""
    if len(roofs) == 1:
        return roofs[0]
    levels: dict[str, MemoryRoof] = {}
    for m in (m for r in roofs for m in r.caches):
        if m.name not in levels or m.bandwidth_bytes_per_s > levels[m.name].bandwidth_bytes_per_s:
            levels[m.name] = m
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
        caches=tuple(sorted(levels.values(), key=lambda m: m.capacity_bytes or 0)),
        cache_notes=tuple(dict.fromkeys(n for r in roofs for n in r.cache_notes)),
    )

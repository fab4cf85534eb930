"""The caches' roofs: read bandwidth of L2 and of the last-level cache, measured here and now.

Why: a model whose weights fit in the CPU's last-level cache (the chef's 20 MB in a 32 MB L3) never
reads them from DRAM, so its decode steps beat the DRAM roof. That is physics, not an error: the
roofline needs the roof such a step really sits under. So besides DRAM we measure each cache level.

What a cache-sized buffer measures, honestly: a buffer half a level's size, filled once and then
read again and again by the same threads, stays (almost all of it) in that level, so the rate is
that level's read bandwidth for these threads: the best a working set that fits there can reach.
It is an upper bound for a real model: a model's weights share the cache with its activations, the
KV cache, and, on a shared L3 in a virtual machine, with other tenants' data.

How the sizes are found (no dependency needed): Linux's sysfs
(/sys/devices/system/cpu/cpu0/cache/index*/: level, type, size), else glibc's
`os.sysconf("SC_LEVEL2_CACHE_SIZE")`, else macOS's `sysctl hw.l2cachesize`. A level whose size
none of them report is not measured, and `CacheRoofs.missing` says so in one line: no size is ever
assumed.

How it is read: `engine/bench/cache_probe.c`, a plain summing loop in C (one slice per thread, many passes
per call), built once with the machine's C compiler (-O3 -march=native, else plain -O3) into the
engine's build cache. Per-call overhead is why not torch: a 1 MB buffer reads in microseconds.
Worked example on this machine kind (2 threads, L2 1 MB per core, L3 32 MB shared): the L2 buffer
is 2 x 512 KB for both threads and 512 KB for one, the L3 buffer 16 MB; each timed call reads at
least 256 MB in all.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.native_build import Build, cache_dir, compile_c, cpu_features

SOURCE = Path(__file__).with_name("cache_probe.c")
BUILDS = (Build(), Build(arch=""))  # the first that builds: this CPU's instructions, else the plain target
BLOCK_WORDS = 32  # the C loop's words per iteration (TPK_BLOCK); slices are whole blocks
MIN_BYTES_PER_CALL = 256 * 2**20  # each timed call reads at least this much, so thread start-up is noise
SIZE_FILES = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class CacheLevel:
    """One cache level as the machine reports it."""

    level: int  # 2 or 3
    size_bytes: int  # one instance's size
    shared: bool  # one instance serves several cores (an L3), else one per core (an L2)
    source: str  # where the size came from: "sysfs", "sysconf", "sysctl"

    def held_by(self, threads: int) -> int:
        """What `threads` threads can keep in this level: the shared size, or one core's size each."""
        return self.size_bytes if self.shared else self.size_bytes * threads


@dataclass(frozen=True)
class CacheRead:
    """One level's measured read bandwidth."""

    level: int
    name: str  # "L2", "L3"
    capacity_bytes: int  # what all the threads can keep there: per-core size x threads, or the shared size
    buffer_bytes: int  # what the faster thread count read, again and again: half of what those threads hold
    bandwidth_bytes_per_s: float
    times_s: list[float]
    bytes_per_call: int
    method: str
    threads: int = 1  # the thread count whose read was faster (see measure_cache_reads)
    by_threads: dict = field(default_factory=dict)  # bytes/s by thread count, as str


def _size(text: str) -> int | None:
    """'1024K' -> 1048576; '32M' -> 33554432; garbage -> None."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    digits = text.rstrip("KMGB")
    return int(digits) * scale if digits.isdigit() else None


def cache_levels() -> list[CacheLevel]:
    """L2 and the last-level cache (L3 where there is one), smallest level first."""
    found: dict[int, CacheLevel] = {}
    for index in sorted(SIZE_FILES.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _size((index / "size").read_text())
            shared_list = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if level >= 2 and kind in ("Unified", "Data") and size:
            shared = "," in shared_list or "-" in shared_list
            found[level] = CacheLevel(level, size, shared, "sysfs")
    if not found:
        found = {c.level: c for c in _sysconf_levels() or _sysctl_levels()}
    return [found[k] for k in sorted(found)]


def _sysconf_levels() -> list[CacheLevel]:
    levels = []
    for level, name, shared in ((2, "SC_LEVEL2_CACHE_SIZE", False), (3, "SC_LEVEL3_CACHE_SIZE", True)):
        try:
            size = os.sysconf(name) if name in os.sysconf_names else 0
        except (OSError, ValueError):
            size = 0
        if size and size > 0:
            levels.append(CacheLevel(level, int(size), shared, "sysconf"))
    return levels


def _sysctl_levels() -> list[CacheLevel]:
    if sys.platform != "darwin":
        return []
    levels = []
    for level, key, shared in ((2, "hw.l2cachesize", False), (3, "hw.l3cachesize", True)):
        try:
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
            size = int(out.stdout.strip() or 0)
        except (OSError, ValueError, subprocess.SubprocessError):
            size = 0
        if size > 0:
            levels.append(CacheLevel(level, size, shared, "sysctl"))
    return levels


@functools.lru_cache(maxsize=1)
def probe_library() -> ctypes.CDLL | str:
    """The built probe, or one line saying why there is none. Built like the native step
    (engine/native_build.py: the same compiler choice, flags and cache), once per machine and source."""
    cc = Build().compiler()
    if cc is None:
        return "no C compiler (cc, gcc or clang on PATH, or set CC) to build the cache probe"
    errors = []
    for build in BUILDS:
        flags = [*build.cflags(), "-fPIC", "-shared"]
        named = f"{cc} {' '.join(flags)} {cpu_features(cc)}".encode()
        path = cache_dir() / f"cache_probe-{hashlib.sha256(SOURCE.read_bytes() + named).hexdigest()[:16]}.so"
        if path.exists() or (error := compile_c(cc, flags, [SOURCE], path)) is None:
            break
        errors.append(error)
    else:
        return f"building the cache probe failed ({cc}): {errors[-1]}"
    lib = ctypes.CDLL(str(path))
    lib.tpk_read_passes.restype = ctypes.c_int
    lib.tpk_read_passes.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_long,
                                    ctypes.POINTER(ctypes.c_uint64)]  # fmt: skip
    return lib


@dataclass
class Reader:
    """`threads` threads summing one filled buffer again and again: `call()` is one timed call's seconds.

    The buffer is split into one slice per thread; each call reads every slice `passes` times (at
    least MIN_BYTES_PER_CALL in all), and the sum proves every read happened."""

    lib: ctypes.CDLL
    words: np.ndarray
    threads: int
    passes: int

    @classmethod
    def make(cls, buffer_bytes: int, threads: int) -> Reader:
        lib = probe_library()
        if isinstance(lib, str):
            raise RuntimeError(lib)
        per = max(buffer_bytes // 8 // threads // BLOCK_WORDS, 1) * BLOCK_WORDS  # words per thread's slice
        words = np.ones(per * threads, dtype=np.uint64)  # written: every page is real
        return cls(lib, words, threads, max(1, -(-MIN_BYTES_PER_CALL // words.nbytes)))

    @property
    def bytes_per_call(self) -> int:
        return self.words.nbytes * self.passes

    def call(self) -> float:
        out = ctypes.c_uint64(0)
        t0 = time.perf_counter()
        rc = self.lib.tpk_read_passes(self.words.ctypes.data, self.words.size, self.threads, self.passes,
                                      ctypes.byref(out))  # fmt: skip
        elapsed = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"the cache probe refused its arguments (code {rc})")
        if out.value != self.passes * self.words.size:  # every word is 1
            raise RuntimeError(f"the cache probe's sum is {out.value}, expected {self.passes * self.words.size}")
        return elapsed


def read_rate(buffer_bytes: int, threads: int, repeats: int) -> tuple[float, list[float], int]:
    """(bytes/s, each call's seconds, bytes per call) of one buffer read `repeats` times after a warm-up.

    The rate is the fastest call's: a call lasts milliseconds, and on shared cores one that lost its
    core for a moment measures the neighbour, not the cache (a roof is what the machine can do)."""
    reader = Reader.make(buffer_bytes, threads)
    reader.call()  # warm-up: brings the buffer into the cache being measured
    times = [reader.call() for _ in range(repeats)]
    return reader.bytes_per_call / min(times), times, reader.bytes_per_call


def measure_cache_reads(threads: int, repeats: int) -> tuple[list[CacheRead], list[str]]:
    """Each cache level's read bandwidth for up to `threads` threads, fastest level first, and one line
    per level that could not be measured (no size reported, no compiler, no buffer that isolates it).

    Each level is read by one thread and by all `threads`, and the faster is its roof, as for DRAM
    (engine/bench/roofline.py): the probe splits its buffer evenly, so a neighbour on one core holds
    the whole split back, while one thread alone reads its own core's share at full speed. A level's
    capacity is what all the threads can keep there (the engine's passes run on all of them)."""
    levels, missing = cache_levels(), []
    if not levels:
        return [], ["this machine reports no cache sizes (sysfs, sysconf, sysctl): only the DRAM roof is drawn"]
    lib = probe_library()
    if isinstance(lib, str):
        return [], [f"{lib}: only the DRAM roof is drawn"]
    counts = sorted({1, threads})
    chosen, below = [], 0  # below: what the faster levels hold, which a slower level's buffer must exceed
    for c in levels:
        capacity = c.held_by(threads)
        if capacity // 2 <= 2 * below:
            missing.append(f"L{c.level} not measured: half of it ({capacity / 2**21:.1f} MB) is not clearly more "
                           f"than the faster caches hold ({below / 2**20:.1f} MB)")  # fmt: skip
            continue
        try:
            readers = {t: Reader.make(c.held_by(t) // 2, t) for t in counts}
            for reader in readers.values():
                reader.call()  # warm-up: brings the buffer into its level (and proves the probe's sum)
        except RuntimeError as err:
            missing.append(f"L{c.level} not measured: {err}")
            continue
        chosen.append((c, capacity, readers))
        below = capacity
    # The calls take turns (L2 by one thread, by all, L3 by one, by all, ...): a neighbour that takes a
    # core for a while then slows every level alike, so their order is measured at the same moments.
    # Each call starts by bringing its buffer back into its level: one pass of the many it reads.
    times = [{t: [] for t in counts} for _ in chosen]
    for _ in range(repeats):
        for i, (_, _, readers) in enumerate(chosen):
            for t, reader in readers.items():
                times[i][t].append(reader.call())
    reads = []
    for (c, capacity, readers), by_count in zip(chosen, times, strict=True):
        rates = {t: readers[t].bytes_per_call / min(by_count[t]) for t in counts}
        best = max(counts, key=rates.__getitem__)
        reader, buffer = readers[best], readers[best].words.nbytes
        reads.append(CacheRead(
            level=c.level, name=f"L{c.level}", capacity_bytes=capacity, buffer_bytes=buffer,
            bandwidth_bytes_per_s=rates[best], times_s=by_count[best], bytes_per_call=reader.bytes_per_call,
            method=f"C probe: {best} thread(s) sum a filled {buffer / 2**20:.1f} MB buffer, half the L{c.level} "
                   f"those threads hold ({c.source}), again and again, in turns with the other levels; the "
                   f"faster of 1 and {threads} thread(s)",
            threads=best, by_threads={str(t): r for t, r in rates.items()},
        ))  # fmt: skip
    return reads, missing

"""Builds and loads engine/native_step.c, the engine's own CPU kernels: the native step
(engine/native.py) and the products engine/native_ops.py hands torch tensors to.

The first process that wants them compiles native_step.c with the machine's C compiler (`$CC`,
else cc, gcc or clang) into a cache folder (`$TWO_POT_NATIVE_CACHE`, else ~/.cache/two-pot-kitchen),
named by a hash of the source, the compiler, the flags and this CPU's features, so later processes
load it at once (the build takes about a second). The features come from engine/native_probe.c,
built once without -march so it runs on any CPU of its kind: a step built for one CPU is never
loaded on another. Without a compiler, or if the build fails, `library()` returns one line saying
why and the callers run torch's kernels instead.

How it is built is a `Build`: by default for this CPU (-march=native on x86-64, -mcpu=native on
ARM); `TWO_POT_NATIVE_ARCH` names another target (`x86-64-v2`: no AVX at all),
`TWO_POT_NATIVE_PORTABLE=1` takes the plain C path, and `TWO_POT_NATIVE_SANITIZE=1` adds
AddressSanitizer and UndefinedBehaviorSanitizer (the process must then preload the ASan runtime).
This module imports nothing of the engine's, so the model's own modules can use it; engine/native_ops.py
calls the kernels from torch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
SOURCE = HERE / "native_step.c"
HEADERS = tuple(HERE / n for n in ("native_vec.h", "native_contract.h", "native_products.h", "native_int8.h", "native_refine.h",
                                   "native_crew.h", "native_attention.h"))  # in the cache key  # fmt: skip
PROBE = HERE / "native_probe.c"
X86 = ("x86_64", "amd64", "i386", "i686")
ARM64 = ("aarch64", "arm64")


@dataclass(frozen=True)
class Build:
    """How the step is compiled: which compiler, for which CPU, with which checks."""

    cc: str | None = None  # None: $CC, else cc, gcc or clang on PATH
    arch: str = "native"  # this CPU; or an -march value ("x86-64-v2", "armv8.2-a+dotprod"); "" for none
    portable: bool = False  # -DTWOPOT_PORTABLE: no intrinsics, no asm
    sanitize: bool = False  # AddressSanitizer + UndefinedBehaviorSanitizer, every report fatal

    @classmethod
    def from_env(cls) -> Build:
        return cls(arch=os.environ.get("TWO_POT_NATIVE_ARCH", "native"),
                   portable=os.environ.get("TWO_POT_NATIVE_PORTABLE") == "1",
                   sanitize=os.environ.get("TWO_POT_NATIVE_SANITIZE") == "1")  # fmt: skip

    def compiler(self) -> str | None:
        for name in (self.cc,) if self.cc else (os.environ.get("CC"), "cc", "gcc", "clang"):
            if name and shutil.which(name):
                return name
        return None

    def cflags(self) -> list[str]:
        """Everything but the output's kind (shared library or program)."""
        flags = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"
                 ] if self.sanitize else ["-O3"]  # fmt: skip
        flags += ["-fno-math-errno", "-Wno-psabi"]  # psabi: gcc's note on 64-byte vectors without AVX-512
        machine = platform.machine().lower()
        if self.arch == "native":
            flags += ["-march=native"] if machine in X86 else ["-mcpu=native"] if machine in ARM64 else []
        elif self.arch:
            flags.append(f"-march={self.arch}")
        return flags + (["-DTWOPOT_PORTABLE"] if self.portable else [])


def cache_dir() -> Path:
    return Path(os.environ.get("TWO_POT_NATIVE_CACHE") or Path.home() / ".cache" / "two-pot-kitchen")


def compile_c(cc: str, flags: list[str], sources: list[Path], out: Path) -> str | None:
    """Compile into `out` atomically (a process beside this one sees the whole file or none): None,
    or the compiler's first error line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, "-o", tmp, *map(str, sources), "-lm", "-lpthread"], capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
            return first or f"{cc} exited with status {done.returncode}"
        os.replace(tmp, out)
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.lru_cache(maxsize=4)
def cpu_features(cc: str | None) -> str:
    """This CPU's features from the probe (built once per architecture with `cc`, then cached); the
    architecture alone where it cannot be built."""
    machine = platform.machine() or "unknown"
    key = hashlib.sha256(PROBE.read_bytes() + machine.encode()).hexdigest()[:16]
    path = cache_dir() / f"native_probe-{key}.so"
    try:
        if not path.exists() and (cc is None or compile_c(cc, ["-O1", "-fPIC", "-shared"], [PROBE], path) is not None):
            return machine
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError):
        return machine
    lib.twopot_cpu_features.restype = ctypes.c_char_p
    return f"{machine} {lib.twopot_cpu_features().decode()}"


def cached_path(build: Build, flags: list[str], cc: str | None) -> Path:
    """Where this build of the step is cached: named by the source, the flags, the compiler where one
    was chosen (so a cached build serves a machine without one), and this CPU's features."""
    source = SOURCE.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    named = f"{build.cc or ''} {' '.join(flags)} {cpu_features(cc)}"
    return cache_dir() / f"native_step-{hashlib.sha256(source + named.encode()).hexdigest()[:16]}.so"


@functools.lru_cache(maxsize=4)
def library(build: Build | None = None) -> ctypes.CDLL | str:
    """The built step as a loaded library, or one line saying why there is none. Built once per process."""
    build = build or Build.from_env()
    cc = build.compiler()
    flags = [*build.cflags(), "-fPIC", "-shared"]
    path = cached_path(build, flags, cc)
    if not path.exists():
        if cc is None:
            return "the native step needs a C compiler (cc, gcc or clang on PATH, or set CC); none found"
        try:
            error = compile_c(cc, flags, [SOURCE], path)
        except (OSError, subprocess.SubprocessError) as err:
            return f"building the native step failed: {type(err).__name__}: {err}"
        if error is not None:
            return f"building the native step failed ({cc}): {error}"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:  # a sanitizer build in a process that did not preload its runtime, say
        return f"loading the native step failed: {str(err).splitlines()[0]}"
    P, i32, why = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    for name in ("twopot_step", "twopot_product", "twopot_attention"):
        getattr(lib, name).restype = i32
    lib.twopot_step.argtypes = [P, P, why, i32]
    lib.twopot_product.argtypes = lib.twopot_attention.argtypes = [P, why, i32]
    lib.twopot_scratch_floats.restype = ctypes.c_long
    lib.twopot_scratch_floats.argtypes = [P, i32, i32]
    lib.twopot_isa.restype = lib.twopot_layout.restype = ctypes.c_char_p
    return lib


def ready() -> bool:
    """Whether the kernels are built and loaded here (built on the first call)."""
    return not isinstance(library(), str)

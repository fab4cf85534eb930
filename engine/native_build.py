"""Builds and loads engine/native_step.c, the engine's own CPU kernels: the native step
(engine/native.py) and the int8 product every few-row int8 pass runs (engine/int8_op.py).

The first process that wants them compiles native_step.c with the machine's C compiler (`$CC`,
else cc, gcc or clang; -O3 -march=native) into a cache folder (`$TWO_POT_NATIVE_CACHE`, else
~/.cache/two-pot-kitchen), named by a hash of the source, the flags and this CPU's feature flags,
so later processes load it at once (the build takes about a second). Without a compiler, or if the
build fails, `library()` returns one line saying why and the callers run torch's kernels instead.
This module imports nothing of the engine's, so the model's own modules can use it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("native_step.c")
HEADERS = tuple(Path(__file__).with_name(n) for n in ("native_products.h", "native_crew.h", "native_attention.h"))  # in the cache key
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno")


def cache_dir() -> Path:
    return Path(os.environ.get("TWO_POT_NATIVE_CACHE") or Path.home() / ".cache" / "two-pot-kitchen")


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | str:
    """The built step as a loaded library, or one line saying why there is none. Built once per process."""
    source = SOURCE.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + _cpu_flags().encode()).hexdigest()[:16]
    path = cache_dir() / f"native_step-{key}.so"
    if not path.exists():
        cc = compiler()
        if cc is None:
            return "the native step needs a C compiler (cc, gcc or clang on PATH, or set CC); none found"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
            os.close(fd)
            done = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm", "-lpthread"], capture_output=True, text=True,
                                  timeout=300)  # fmt: skip
            if done.returncode != 0:
                os.unlink(tmp)
                first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
                return f"building the native step failed ({cc}): {first}"
            os.replace(tmp, path)  # atomic: a process beside this one sees the whole file or none
        except (OSError, subprocess.SubprocessError) as err:
            return f"building the native step failed: {type(err).__name__}: {err}"
    lib = ctypes.CDLL(str(path))
    P, i32 = ctypes.c_void_p, ctypes.c_int
    lib.twopot_step.restype = i32
    lib.twopot_step.argtypes = [P, i32, P, P, P, i32, P, P, i32, i32, P, P, P, i32, i32]
    lib.twopot_scratch_floats.restype = ctypes.c_long
    lib.twopot_scratch_floats.argtypes = [P, i32, i32]
    lib.twopot_gemm_f32.restype = lib.twopot_gemm_int8.restype = None
    lib.twopot_gemm_f32.argtypes = [i32, i32, i32, P, P, P]
    lib.twopot_gemm_int8.argtypes = [i32, i32, i32, P, P, P, P, P, P, P]
    return lib


def ready() -> bool:
    """Whether the kernels are built and loaded here (built on the first call)."""
    return not isinstance(library(), str)


def int8_unscaled(x: torch.Tensor, q: torch.Tensor, rowsum: torch.Tensor) -> torch.Tensor:
    """x (M, K) float32 -> x @ q^T (M, N) float32, W8A8: each row of x rounded to 8 bits over its own
    range, int8 x int8 products summed exactly (native_step.c `gemm_int8`); q's scales not applied.
    q (N, K) int8 and rowsum (N,) int32 = q.sum(1), both contiguous. The native step runs
    the same function on its rows, so a row gets the same numbers in every pass."""
    lib = library()
    x = x.float().contiguous()
    M, K = x.shape
    N = q.shape[0]
    y = torch.empty(M, N)  # (M, N)
    xu = torch.empty(M * K, dtype=torch.uint8)  # the rows rounded to 8 bits
    sx = torch.empty(M)  # each row's scale
    lib.twopot_gemm_int8(M, K, N, x.data_ptr(), q.data_ptr(), None, rowsum.data_ptr(), y.data_ptr(),
                         xu.data_ptr(), sx.data_ptr())  # fmt: skip
    return y

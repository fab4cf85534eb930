"""The native tests again, with the step built two other ways, each in a child pytest:

- for x86-64-v2 (SSE4.2: no AVX, no AVX2, no AVX-512), the oldest x86-64 CPUs the app meets
  (`TWO_POT_NATIVE_ARCH=x86-64-v2`, engine/native_build.py);
- under AddressSanitizer and UndefinedBehaviorSanitizer (`TWO_POT_NATIVE_SANITIZE=1`).

Why the sanitizers run in a Python process, not in a C driver: the native tests then run as they
are, on the real engine's tensors, and torch allocates those with malloc, which ASan intercepts, so
a read one float past a weight, a seat or a scratch buffer is a report. An ASan-built library loads
only into a process that starts with the ASan runtime, so the child preloads gcc's (LD_PRELOAD).
detect_leaks=0: Python and torch keep allocations until exit by design, and LeakSanitizer would list
them. Every report is fatal (-fno-sanitize-recover) and goes to a file (log_path), so the child
fails and this test fails with the report's text. A first child proves that path: it hands the
step a buffer one float shorter than the length it claims, and ASan must report it.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from proc_kit import run, said

from engine.native_build import library

REPO = Path(__file__).resolve().parents[1]
NATIVE_TESTS = ["tests/test_native.py", "tests/test_native_contract.py", "tests/test_int8_head.py"]
pytestmark = pytest.mark.skipif(isinstance(library(), str), reason="the native step could not be built here")

OVERFLOW = """
import ctypes, torch
from engine.native_build import library
from engine.native_contract import Buf, Product
lib = library()
print(lib.twopot_isa().decode() if not isinstance(lib, str) else lib, flush=True)
x, w, y = torch.randn(3 * 64 - 1), torch.randn(64, 10), torch.empty(3, 10)  # x: one float short of (3, 64)
p = Product(rows=3, depth=64, cols=10, int8=0)
p.x, p.w, p.y = Buf(x.data_ptr(), 3 * 64, 1), Buf(w.data_ptr(), 640, 1), Buf(y.data_ptr(), 30, 1)
lib.twopot_product(ctypes.byref(p), None, 0)
print("no report", flush=True)
"""


def child(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return run([sys.executable, *args], cwd=REPO, env=os.environ | {"HF_HUB_OFFLINE": "1"} | env, timeout=900,
               check=False)  # fmt: skip


def native_tests(env: dict[str, str]) -> str:
    """tests/test_native*.py in a child pytest: every test passed (none skipped), or its output."""
    done = child(["-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs", *NATIVE_TESTS], env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, said(done)
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed", summary) and "skipped" not in summary and "failed" not in summary, summary
    return summary


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64-v2 is an x86-64 target")
def test_the_native_tests_pass_with_the_step_built_for_x86_64_v2(tmp_path):
    env = {"TWO_POT_NATIVE_ARCH": "x86-64-v2", "TWO_POT_NATIVE_CACHE": str(tmp_path)}
    isa = child(["-c", "from engine.native_build import library; print(library().twopot_isa().decode())"], env)
    assert isa.stdout.strip() == "SSE", said(isa)  # built with no AVX of any width
    native_tests(env)


def test_the_native_tests_pass_under_asan_and_ubsan_with_no_report(tmp_path):
    runtime = run(["gcc", "-print-file-name=libasan.so"], timeout=60, check=False).stdout.strip()
    if not os.path.isabs(runtime):
        pytest.skip("gcc's AddressSanitizer runtime (libasan) is not installed")
    logs = tmp_path / "reports"
    logs.mkdir()
    env = {"LD_PRELOAD": runtime, "TWO_POT_NATIVE_SANITIZE": "1", "TWO_POT_NATIVE_CACHE": str(tmp_path / "cache"),
           "ASAN_OPTIONS": f"detect_leaks=0:log_path={logs}/asan", "UBSAN_OPTIONS": f"print_stacktrace=1:log_path={logs}/ubsan"}  # fmt: skip

    def reports() -> str:
        return "\n".join(p.read_text() for p in sorted(logs.iterdir()))

    proof = child(["-c", OVERFLOW], env)  # the sanitized step, handed a short buffer: a report, and the child stops
    assert proof.returncode != 0 and "no report" not in proof.stdout, said(proof)
    assert "AddressSanitizer: heap-buffer-overflow" in reports() and "twopot_product" in reports()
    for p in logs.iterdir():
        p.unlink()
    try:
        native_tests(env)
    finally:
        assert not reports(), reports()[-6000:]

"""The engine on a faked macOS-like and Windows-like host: it loads and cooks, reading no Linux file.

Each host is a child Python process that takes away, before the engine is imported, what that
system lacks: /proc (any open, listing or read of a /proc path from code other than psutil fails,
and is recorded: psutil has its own way on those systems), the sched_* affinity calls, os.sysconf's
Linux names (macOS) or os.sysconf, os.uname and os.getloadavg (Windows), and psutil's cpu_affinity
(macOS has none). sys.platform says "darwin" or "win32". The macOS-like host has a C compiler
(Xcode's tools), so the native step builds; the Windows-like one has none on PATH, so every pass
runs op by op and the engine says why in one line. Both must give the tokens this process gets.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from proc_kit import run
from test_compiled import PROMPTS

from engine import Engine

REPO = Path(__file__).resolve().parents[1]
FAKE = """
import builtins, io, os, platform, sys, json
import psutil, torch  # torch reads its own files first; psutil is the host's library on every system
KIND, TOUCHED = {kind!r}, []

def _psutil_asks():  # psutil reads /proc on Linux; on macOS and Windows it asks the system its own way
    f = sys._getframe(2)
    while f is not None:
        if f.f_globals.get("__name__", "").startswith("psutil"):
            return True
        f = f.f_back
    return False

def _guard(fn):
    def guarded(path, *args, **kwargs):
        p = os.fspath(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
        if isinstance(p, str) and p.startswith("/proc") and not _psutil_asks():
            TOUCHED.append(p)
            raise FileNotFoundError(2, "no /proc on this host", p)
        return fn(path, *args, **kwargs)
    return guarded

builtins.open = io.open = _guard(io.open)
os.listdir, os.scandir, os.stat = _guard(os.listdir), _guard(os.scandir), _guard(os.stat)
for name in ("sched_getaffinity", "sched_setaffinity"):
    delattr(os, name)
if KIND == "macos":
    real_sysconf = os.sysconf
    def sysconf(name):  # macOS has SC_PAGE_SIZE but not Linux's SC_AVPHYS_PAGES or SC_PHYS_PAGES
        if name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
            raise ValueError("unrecognized configuration name")
        return real_sysconf(name)
    os.sysconf = sysconf
    del psutil.Process.cpu_affinity
    sys.platform = "darwin"
else:
    del os.uname, os.sysconf, os.getloadavg
    os.environ["PROCESSOR_ARCHITECTURE"] = "AMD64"
    sys.platform = "win32"
platform._uname_cache = None

import engine
from serving import cores
eng = engine.Engine.load({path!r}, max_seqs=2)
res = eng.generate([{prompt!r}], max_new_tokens=8, stop_at_eos=False)  # an order
rid, served = eng.submit({prompt!r}, max_new_tokens=8, stop_at_eos=False), []  # and the serving path
while not eng.idle:
    served += [e.token_id for e in eng.step() if type(e).__name__ == "Token" and e.request_id == rid]
split = cores.split_cores(1)
if split is not None:
    cores.pin_this_process(split.engine)
print(json.dumps({{"decode_step": eng.info.decode_step, "tokens": res.tokens[0], "served": served, "touched": TOUCHED,
                  "cores": sorted(cores.ALL_CORES), "split": split is not None,
                  "pinned": sorted(psutil.Process().cpu_affinity()) if split else None,
                  "threads": cores.engine_threads(), "budget": eng.serving_limits().budget_bytes}}))
"""


def on_host(kind: str, model, tmp_path, env: dict[str, str]) -> dict:
    code = FAKE.format(kind=kind, path=str(model.path), prompt=PROMPTS[0])
    env = os.environ | {"TWO_POT_NATIVE_CACHE": str(tmp_path / "cache"), "TWO_POT_PIN": "1"} | env
    done = run([sys.executable, "-c", code], cwd=REPO, env=env, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def want(tiny_llama) -> list[int]:
    return Engine.load(str(tiny_llama.path), native=False).generate([PROMPTS[0]], max_new_tokens=8, stop_at_eos=False).tokens[0]


def test_a_macos_like_host_builds_the_native_step_and_cooks(tiny_llama, tmp_path, want):
    got = on_host("macos", tiny_llama, tmp_path, {})
    assert got["touched"] == [] and got["tokens"] == got["served"] == want
    assert got["decode_step"].startswith("native (")  # the compiler is there: the step is built and runs
    assert got["cores"] == [] and not got["split"]  # no affinity API: the cores are never split
    assert got["threads"] >= 1 and got["budget"] > 0  # memory from psutil, not /proc/meminfo or sysconf


def test_a_windows_like_host_without_a_compiler_cooks_op_by_op_and_says_why(tiny_llama, tmp_path, want):
    got = on_host("windows", tiny_llama, tmp_path, {"CC": "", "PATH": os.path.dirname(sys.executable)})
    assert got["touched"] == [] and got["tokens"] == got["served"] == want
    assert got["decode_step"] == ("op by op: the native step needs a C compiler (cc, gcc or clang on PATH, "
                                  "or set CC); none found")  # fmt: skip
    assert got["cores"] == sorted(os.sched_getaffinity(0))  # psutil's affinity, as Windows has it
    assert got["split"] == (len(got["cores"]) > 1)
    assert got["pinned"] == (got["cores"][-1:] if got["split"] else None)  # the whole process, at once
    assert got["budget"] > 0

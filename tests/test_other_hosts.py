"""The app's kitchen and the class kitchen start and cook on a macOS-like and a Windows-like host.

This machine is Linux; the other hosts are faked in a process of their own, and in every process it
starts, by a `sitecustomize` module on its import path (Python imports it at startup, the engine's
loop process included, since it inherits the path): no `/proc` (opening or listing anything under
it fails as on a machine without it, except from psutil, which asks those systems its own way), no
`sched_getaffinity` / `sched_setaffinity`; on the macOS-like host no psutil `cpu_affinity` either;
on the Windows-like host also no `fork`, no `pass_fds` for a child process, no `os.uname`,
`os.sysconf` or `os.getloadavg` (numpy is imported first: on Linux it asks `os.uname` at import,
on Windows it never does). Each process the fake reached leaves a mark, so the test knows the
engine's loop ran faked too. `sys.platform` stays "linux": multiprocessing would take its Windows
branch (`_winapi`) otherwise; the engine's own reading of the platform is tests/test_portable_host.py's.
So the macOS-like host forks its loops from the fork server as Linux does (serving/host/spawn.py;
real macOS spawns them, as the Windows-like host here does, having no fork).

In that process: the Kitchen's client on the app's own host (called directly, as the Kitchen calls
it) checks and cooks an order, and the class kitchen's server answers an OpenAI completion.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from proc_kit import run, said

ROOT = Path(__file__).resolve().parent.parent

SITECUSTOMIZE = textwrap.dedent('''
    import builtins, io, os, subprocess, sys
    KIND = os.environ.get("FAKE_HOST_KIND")
    if KIND:
        import numpy  # noqa: F401 -- Linux's numpy asks os.uname for the kernel at import; Windows' never does
        import psutil
        gone = ("fork", "forkpty", "uname", "sysconf", "getloadavg") if KIND == "windows" else ()
        for name in ("sched_getaffinity", "sched_setaffinity") + gone:
            if hasattr(os, name):
                delattr(os, name)
        if KIND == "macos":
            del psutil.Process.cpu_affinity
        _open, _listdir, _scandir = builtins.open, os.listdir, os.scandir

        def _psutil_asks():  # psutil reads /proc on Linux; on macOS and Windows it asks the system its own way
            f = sys._getframe(2)
            while f is not None:
                if f.f_globals.get("__name__", "").startswith("psutil"):
                    return True
                f = f.f_back
            return False

        def _no_proc(path):
            p = os.fspath(path) if not isinstance(path, int) else ""
            if isinstance(p, bytes):
                p = p.decode()
            if (p == "/proc" or p.startswith("/proc/")) and not _psutil_asks():
                raise FileNotFoundError(2, "No such file or directory (a host without /proc)", p)

        def fake_open(file, *args, **kwargs):
            _no_proc(file)
            return _open(file, *args, **kwargs)

        def fake_listdir(path="."):
            _no_proc(path)
            return _listdir(path)

        def fake_scandir(path="."):
            _no_proc(path)
            return _scandir(path)

        builtins.open = io.open = fake_open
        os.listdir, os.scandir = fake_listdir, fake_scandir
        if KIND == "windows":
            _init = subprocess.Popen.__init__

            def popen(self, *args, pass_fds=(), **kwargs):
                if pass_fds:
                    raise ValueError("pass_fds is not supported on Windows")
                _init(self, *args, **kwargs)

            subprocess.Popen.__init__ = popen
        with _open(os.path.join(os.environ["FAKE_HOST_MARKS"], str(os.getpid())), "w") as f:
            f.write(KIND)
''')

SCENARIO = textwrap.dedent('''
    import json, os, subprocess, sys
    import httpx
    import psutil
    from kitchen_viz.orders import Order
    from lab.sweeps import LabSweeps
    from serving.host_client import HostClient
    from serving.http.mounted import own_hosts
    from serving.http.server import ServerConfig, create_app, open_host
    from serving.caps import Caps
    from serving.host.loop import LoopSettings
    from engine.settings import EngineSettings
    sys.path.insert(0, os.environ["TESTS_DIR"])
    from kitchen_server import serve

    faked = {"sched": hasattr(os, "sched_getaffinity"), "uname": hasattr(os, "uname"), "fork": hasattr(os, "fork"),
             "loadavg": hasattr(os, "getloadavg")}
    try:
        open("/proc/self/stat")
        faked["proc"] = True
    except FileNotFoundError:
        faked["proc"] = False
    try:
        subprocess.Popen([sys.executable, "-c", "pass"], pass_fds=[0]).wait()
        faked["pass_fds"] = True
    except ValueError:
        faked["pass_fds"] = False
    out = {"present": faked}

    hosts = own_hosts(LabSweeps())  # the app's own kitchen, as the Kitchen page opens it
    svc = HostClient(lambda: hosts.host_for("chef", "cpu", "float32"), "chef")
    assert svc.wait_ready(180), "the kitchen did not open"
    out["kitchen_state"], out["kitchen_error"] = svc.state, svc.load_error
    order = Order(batch=2, max_new_tokens=6, temperature=0.0, seed=0, prompt_tokens=12)
    job = svc.submit(svc.check(order.form()), order.label)
    job.wait(120)
    out["kitchen_job"] = [job.status, job.error, [len(t) for t in job.result.tokens] if job.result else None]
    out["kitchen_pid"], out["kitchen_parent"] = svc.engine_pid, psutil.Process(svc.engine_pid).ppid()
    svc.close()
    hosts.rooms.close()

    host = open_host("chef", LoopSettings("chef", EngineSettings(policy="chunked", prefix_cache=True)), Caps())
    assert host.wait_ready(180), host.status
    out["class_pid"], out["class_parent"] = host.process.pid, psutil.Process(host.process.pid).ppid()
    out["me"] = os.getpid()
    with serve(create_app(host, ServerConfig(host.name, None, host.caps))) as url:
        r = httpx.post(url + "/v1/completions", json={"model": "chef", "prompt": "ROMEO:", "max_tokens": 5,
                                                      "temperature": 0}, timeout=120)
        body = r.json()
        out["class_completion"] = [r.status_code, body["usage"]["completion_tokens"] if r.status_code == 200 else body]
    host.close()
    print("RESULT " + json.dumps(out))
''')


@pytest.mark.parametrize("kind", ["macos", "windows"])
def test_the_app_kitchen_and_the_class_kitchen_cook_on_another_kind_of_host(kind, tmp_path):
    site, marks = tmp_path / "site", tmp_path / "marks"
    site.mkdir()
    marks.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, FAKE_HOST_KIND=kind, FAKE_HOST_MARKS=str(marks), TESTS_DIR=str(ROOT / "tests"),
               PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")  # fmt: skip
    proc = run([sys.executable, "-c", SCENARIO], env=env, timeout=600, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, said(proc)
    out = json.loads(lines[-1][len("RESULT "):])
    windows = kind == "windows"
    assert out["present"] == {"sched": False, "proc": False, "uname": not windows, "fork": not windows,
                              "pass_fds": not windows, "loadavg": not windows}  # the host is faked as it should be  # fmt: skip
    assert out["kitchen_state"] == "ready" and out["kitchen_error"] is None
    assert out["kitchen_job"] == ["done", None, [6, 6]]
    assert out["class_completion"] == [200, 5]
    faked = {int(p.name) for p in marks.iterdir()}
    loops, parents = {out["kitchen_pid"], out["class_pid"]}, {out["kitchen_parent"], out["class_parent"]}
    if windows:  # no fork: each loop is a fresh interpreter that started on the faked host
        assert loops <= faked and parents == {out["me"]}
    else:  # sys.platform is "linux": the loops are forked from the fork server, which started faked
        assert parents <= faked and out["me"] not in parents

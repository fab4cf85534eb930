"""A real class kitchen server in a thread, for tests: `with kitchen(...) as (url, host): ...`."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

from engine.settings import EngineSettings
from lab.sweeps import LabSweeps
from serving.caps import Caps
from serving.host.loop import LoopSettings
from serving.http.server import ServerConfig, create_app, open_host

WAIT_S = 120


@contextmanager
def kitchen(caps: Caps | None = None, api_key: str | None = None, model: str = "chef", native: bool = True):
    """The chef behind `two-pot-kitchen serve`'s app on a free loopback port; yields (url, process):
    the engine process of the `EngineHost` the routes adapt (`process.host`, `process.app`).
    `native=False`: the torch forward op by op, for a test that needs an order slower than a limit."""
    engine = EngineSettings(policy="chunked", token_budget=64, prefix_cache=True, native=native)
    settings = LoopSettings(model, engine, threads=1)
    host = open_host(model, settings, caps or Caps(), LabSweeps())
    try:
        assert host.wait_ready(WAIT_S), host.status
        app = create_app(host, ServerConfig(host.name, api_key, host.caps))
        process = host.process
        process.host, process.app = host, app  # for tests that look inside the server
        with serve(app) as url:
            yield url, process
    finally:
        host.close()


@contextmanager
def serve(app):
    """Any ASGI app with uvicorn on a free loopback port, in a thread; yields its URL."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def kitchen_process(*args: str):
    """`two-pot-kitchen serve --model chef ARGS` as its own process on a free loopback port (so its memory
    can be read: serving.clients.loadgen.rss_kb); yields (url, process).

    Its stderr goes to a file, shown only if it fails to start or the test fails: a pipe nobody
    drains during the test fills at 64 KB, and the server's next log line then blocks its event
    loop and every stream."""
    import os
    import subprocess
    import sys
    import tempfile

    import httpx

    from serving.clients.rush import allow_open_files

    allow_open_files()  # the server inherits it: a rush holds a socket per client on both sides
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "serving.http.server", "--model", "chef", "--port", str(port), *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        log.seek(0)
        return log.read().decode(errors="replace")[-2000:]

    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, tail()
            assert time.time() < deadline, "the kitchen did not start in 120 s"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        try:
            yield url, proc
        except BaseException:  # a failing test shows what the server said (pytest prints captured stderr)
            print(f"--- the kitchen server's stderr ---\n{tail()}", file=sys.stderr)
            raise
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()

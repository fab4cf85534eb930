"""A real class kitchen server in a thread, for tests: `with kitchen(...) as (url, client): ...`."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

from lab.on_server import LabRoutes
from serving.caps import Caps
from serving.class_board import ClassBoard
from serving.engine_client import EngineClient, LoopSettings
from serving.metrics import KitchenMetrics
from serving.server import ServerConfig, close_app, create_app, served_name


@contextmanager
def kitchen(caps: Caps | None = None, api_key: str | None = None, model: str = "chef"):
    """The chef behind `two-pot-kitchen serve`'s app on a free loopback port; yields (url, client)."""
    name, source = served_name(model)
    metrics = KitchenMetrics(name)
    settings = LoopSettings(source, policy="chunked", token_budget=64, threads=1, prefix_cache=True)
    client = EngineClient(settings, metrics, ClassBoard())
    app = create_app(client, ServerConfig(name, api_key, caps or Caps()), metrics, (LabRoutes,))
    client.app = app  # for tests that look inside the server
    try:
        with serve(app) as url:
            yield url, client
    finally:
        close_app(app)
        client.close()


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

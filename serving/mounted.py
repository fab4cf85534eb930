"""The class kitchen inside the app's own server: `two-pot-kitchen --class-kitchen [MODEL]`.

One command and one address for a workshop: the app at http://HOST:8501/ and, on the same port,
the class kitchen server (serving/server.py) at http://HOST:8501/class/v1, with its board,
/class/metrics for the pass and /class/health. Its engine runs in its own kitchen-loop process, as
under `two-pot-kitchen serve`; the app's server process only routes HTTP to it. The launcher
passes the choice through the environment (the Streamlit process inherits it):

    TWO_POT_CLASS_KITCHEN   the model to serve (a catalog name, preset:NAME or a folder)
    TWO_POT_CLASS_KEY       its API key, if any (students then send `Authorization: Bearer KEY`)
    TWO_POT_CAPS            the instructor's caps, the same file the Kitchen obeys

The kitchen loads in a background thread when the server starts, so the app opens at once;
until the model is ready every /class request gets a 503 with one line saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading

from starlette.routing import Mount

ENV_MODEL, ENV_KEY = "TWO_POT_CLASS_KITCHEN", "TWO_POT_CLASS_KEY"
PREFIX = "/class"


class ClassKitchenMount:
    """The ASGI app mounted at /class: a one-line 503 until the kitchen is ready, then the server."""

    def __init__(self, model: str, api_key: str | None):
        self.model, self.api_key = model, api_key
        self.app = None
        self.client = None
        self.status = f"the class kitchen is loading {model}; try again in a few seconds"

    def start(self) -> None:
        """Load the model in a kitchen-loop process (blocking: call it from a thread)."""
        from engine.errors import EngineError
        from serving.caps import load_caps
        from serving.class_board import ClassBoard
        from serving.engine_client import EngineClient, LoopSettings
        from serving.metrics import KitchenMetrics
        from serving.server import ServerConfig, create_app, served_name

        try:
            name, source = served_name(self.model)
            metrics = KitchenMetrics(name)
            self.client = EngineClient(LoopSettings(source), metrics, ClassBoard())
            self.app = create_app(self.client, ServerConfig(name, self.api_key, load_caps(None)), metrics)
        except EngineError as err:
            self.status = f"the class kitchen could not start: {err}"

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    async def __call__(self, scope, receive, send) -> None:
        if self.app is not None:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"message": self.status, "type": "server_error", "param": None,
                                     "code": 503}}).encode()  # fmt: skip
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})


def class_kitchen(base: str = "") -> tuple[list, object | None]:
    """(routes, lifespan) for serve.py's st.App: the /class mount (under Streamlit's base path
    `base`, e.g. "/kitchen") when the launcher asked for one."""
    model = os.environ.get(ENV_MODEL)
    if not model:
        return [], None
    mount = ClassKitchenMount(model, os.environ.get(ENV_KEY) or None)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        threading.Thread(target=mount.start, daemon=True, name="class-kitchen-loader").start()
        try:
            yield {}
        finally:
            mount.close()

    return [Mount(base + PREFIX, app=mount)], lifespan

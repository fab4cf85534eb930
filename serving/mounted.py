"""The app's own kitchen server, inside the app's server: the class kitchen and the Kitchen's kitchens.

One command and one address for a workshop: the app at http://HOST:8501/ and, on the same port,
the class kitchen server (serving/server.py) at http://HOST:8501/class/v1, with its board,
/class/metrics for the pass and /class/health. The Kitchen page cooks in the same kitchens: the
class's when it cooks the class's model on the CPU in float32, so its orders join the class's
batch, and otherwise a kitchen opened on demand (served at /kitchens/MODEL/DEVICE/PRECISION;
catalog names only, at most `MAX_KITCHENS` at once, the least recently used idle one closed for a
new one). Each kitchen's engine runs in its own kitchen-loop process, pinned to the engine's cores
(serving/cores.py); the app's server process only routes requests to it. What to mount comes
from the launcher's `AppSettings` (serving/app_settings.py): `kitchens` (the Kitchen's, unless
--backend), `class_model` and `class_key` (the class kitchen and its API key); the caps are the
file the Kitchen obeys (serving/caps.py).

A kitchen loads in a background thread, so the app opens at once; until its model is ready every
request to it gets a 503 with one line saying so.

The Kitchen page runs in this same process, so it does not order over HTTP: `served_here()` hands
it these kitchens and `AppKitchens.host(...)` a `serving.kitchen_orders.LocalHost` on the chosen one (the
routes above stay for the class's students and any other client).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import OrderedDict
from urllib.parse import quote

from starlette.routing import Mount

from engine.errors import EngineError
from serving.app_settings import ENV, AppSettings
from serving.caps import load_caps
from serving.catalog import load_catalog
from serving.class_board import ClassBoard
from serving.cores import engine_threads, pin_this_process, split_cores
from serving.engine_client import EngineClient
from serving.host import NotReady
from serving.kitchen_loop import LoopSettings
from serving.kitchen_orders import LocalHost
from serving.metrics import KitchenMetrics
from serving.server import ServerConfig, close_app, create_app, served_name

ENV_MODEL, ENV_KEY, ENV_KITCHENS = ENV["class_model"], ENV["class_key"], ENV["kitchens"]  # serving/app_settings.py
PREFIX, KITCHENS = "/class", "/kitchens"
CLASS_DEVICE, CLASS_DTYPE = "cpu", "float32"
MAX_KITCHENS = 3  # kitchens opened on demand, besides the class's
# Tokens one pass may compute: a Kitchen order of up to this many prompt tokens goes through the
# wok in one pass, as the lesson says (the chef's 8 tables x 448 tokens fit); a larger one takes
# several passes, and its trace says so (engine/request_group.py).
TOKEN_BUDGET = 4096
PRECISIONS = ("float32", "bfloat16", "float16", "int8")
# A seat of the app's kitchens holds this many tokens (prompt + reply), capped by the model's context:
# the chef's whole context (2,560), so the Kitchen's longest prompt is the model's, not the engine's default.
SEAT_TOKENS = 4096


def kitchen_path(model: str, device: str, dtype: str) -> str:
    """Where the Kitchen finds the kitchen for this choice, under the app's base path."""
    if AppSettings.from_env().class_model == model and (device, dtype) == (CLASS_DEVICE, CLASS_DTYPE):
        return PREFIX
    return f"{KITCHENS}/{quote(model, safe='')}/{quote(device, safe='')}/{dtype}"


def loop_settings(source: str, device: str, dtype: str):
    """The kitchen loop's settings in the app: the engine's threads on cores of their own, and
    (with the launcher's `pin_server`) this server's threads moved off them."""
    threads = engine_threads()
    split = split_cores(threads)
    if split is not None and AppSettings.from_env().pin_server:
        pin_this_process(split.server)
    invariant = AppSettings.from_env().batch_invariant and device == "cpu" and dtype == "float32"  # where it can hold
    return LoopSettings(source, device, dtype, token_budget=TOKEN_BUDGET, threads=threads, max_seq_len=SEAT_TOKENS,
                        cores=tuple(sorted(split.engine)) if split is not None else (),
                        batch_invariant=invariant)  # fmt: skip


class ClassKitchenMount:
    """One kitchen's ASGI app (the class's at /class): a one-line 503 until it is ready, then the server."""

    def __init__(self, model: str, api_key: str | None, device: str = CLASS_DEVICE, dtype: str = CLASS_DTYPE,
                 extensions: tuple = ()):  # fmt: skip
        self.model, self.api_key, self.device, self.dtype = model, api_key, device, dtype
        self.extensions = extensions  # the server's extensions (serving/server.py `create_app`)
        self.app = None
        self.client = None
        self.used_at = time.monotonic()
        self.status = f"the kitchen is loading {model} on {device} ({dtype}); try again in a few seconds"

    def start(self) -> None:
        """Load the model in a kitchen-loop process (blocking: call it from a thread)."""
        try:
            name, source = served_name(self.model)
            metrics = KitchenMetrics(name)
            self.client = EngineClient(loop_settings(source, self.device, self.dtype), metrics, ClassBoard())
            config = ServerConfig(name, self.api_key, load_caps(None))
            self.app = create_app(self.client, config, metrics, self.extensions)
        except EngineError as err:
            self.status = f"the kitchen could not start: {err}"

    def close(self) -> None:
        if self.app is not None:
            close_app(self.app)  # the extensions' own processes (the Lab's engine, if a sweep started one)
        if self.client is not None:
            self.client.close()

    @property
    def idle(self) -> bool:
        return self.app is not None and self.client.in_flight == 0

    @property
    def failed(self) -> bool:
        return self.app is None and self.status.startswith("the kitchen could not start")

    async def __call__(self, scope, receive, send) -> None:
        self.used_at = time.monotonic()
        if self.app is not None:
            await self.app(scope, receive, send)
            return
        await refuse(send, 503, self.status)


async def refuse(send, status: int, line: str) -> None:
    """A one-line JSON error (OpenAI's error object), without a router."""
    kind = "server_error" if status >= 500 else "not_found_error"
    body = json.dumps({"error": {"message": line, "type": kind, "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


class KitchenRooms:
    """The ASGI app at /kitchens/{model}/{device}/{precision}: that kitchen, opened on first use."""

    def __init__(self, api_key: str | None, extensions: tuple = ()):
        self.api_key, self.extensions = api_key, extensions
        self.rooms: OrderedDict[tuple[str, str, str], ClassKitchenMount] = OrderedDict()
        self.lock = threading.Lock()

    async def __call__(self, scope, receive, send) -> None:
        p = scope.get("path_params", {})
        key = (p.get("model", ""), p.get("device", ""), p.get("precision", ""))
        problem = self.refusal(*key)
        if problem is not None:
            await refuse(send, 404, problem)
            return
        room, problem = self.room(key)
        if room is None:
            await refuse(send, 503, problem)
            return
        await room(scope, receive, send)

    @staticmethod
    def refusal(model: str, device: str, precision: str) -> str | None:
        """Why this kitchen cannot be opened (one line), or None. Catalog names only: never a path."""
        try:
            names = [e.name for e in load_catalog().entries]
        except EngineError as err:
            return str(err)
        if model not in names:
            return f"no model '{model}' in this server's catalog ({', '.join(names)})"
        if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
            return f"device must be cpu or cuda[:N] (got '{device}')"
        if precision not in PRECISIONS:
            return f"precision must be one of {', '.join(PRECISIONS)} (got '{precision}')"
        return None

    def room(self, key: tuple[str, str, str]) -> tuple[ClassKitchenMount | None, str]:
        with self.lock:
            if key in self.rooms:
                self.rooms.move_to_end(key)
                return self.rooms[key], ""
            if len(self.rooms) >= MAX_KITCHENS:
                idle = next((k for k, r in self.rooms.items() if r.idle or r.failed), None)
                if idle is None:
                    return None, (f"this server already runs {MAX_KITCHENS} kitchens and every one is cooking; "
                                  "try again when an order is done")  # fmt: skip
                self.rooms.pop(idle).close()
            room = ClassKitchenMount(key[0], self.api_key, key[1], key[2], self.extensions)
            self.rooms[key] = room
        threading.Thread(target=room.start, daemon=True, name=f"kitchen-loader-{key[0]}").start()
        return room, ""

    def close(self) -> None:
        with self.lock:
            rooms, self.rooms = list(self.rooms.values()), OrderedDict()
        for room in rooms:
            room.close()


class AppKitchens:
    """The kitchens this process serves: the class's (`mount`) and the Kitchen's rooms (`rooms`)."""

    def __init__(self, mount: ClassKitchenMount | None, rooms: KitchenRooms | None):
        self.mount, self.rooms = mount, rooms

    def app_for(self, model: str, device: str, dtype: str):
        """The server app that cooks this choice (serving/server.py `create_app`), opened on first use;
        `NotReady` while it loads, `EngineError` (one line) when it cannot be opened."""
        if self.mount is not None and kitchen_path(model, device, dtype) == PREFIX:
            room = self.mount
        elif self.rooms is not None:
            problem = self.rooms.refusal(model, device, dtype)
            if problem is not None:
                raise EngineError(problem)
            room, problem = self.rooms.room((model, device, dtype))
            if room is None:
                raise NotReady(problem)
        else:
            raise EngineError(f"this server opens no kitchen for {model} on {device} ({dtype})")
        room.used_at = time.monotonic()
        if room.app is None:
            raise EngineError(room.status) if room.failed else NotReady(room.status)
        return room.app

    def host(self, model: str, device: str, dtype: str) -> LocalHost:
        return LocalHost(lambda: self.app_for(model, device, dtype))


_SERVED: list[AppKitchens] = []  # what class_kitchen() mounted in this process


def served_here() -> AppKitchens | None:
    """The kitchens mounted in this process (`two-pot-kitchen` serves serve.py), or None (plain
    `streamlit run app.py`, page tests, before `own_kitchens()`)."""
    return _SERVED[-1] if _SERVED else None


_OWN_LOCK = threading.Lock()


def own_kitchens(extensions: tuple = ()) -> AppKitchens:
    """This process's kitchens for the Kitchen: the ones serve.py mounted, or, under plain
    `streamlit run app.py` (nothing mounted), the same rooms opened here on first use with no
    routes (the Kitchen reaches them in process). Either way one code path cooks."""
    with _OWN_LOCK:
        here = served_here()
        if here is None or here.rooms is None:
            here = AppKitchens(here.mount if here is not None else None, KitchenRooms(None, extensions))
            _SERVED.append(here)
        return here


def class_kitchen(base: str = "", extensions: tuple = ()) -> tuple[list, object | None]:
    """(routes, lifespan) for serve.py's st.App, under Streamlit's base path `base` (e.g. "/kitchen"):
    the class kitchen at /class when the launcher named one, and the Kitchen's kitchens at
    /kitchens/... when it asked for them; each server with `extensions` (the Lab's routes)."""
    s = AppSettings.from_env()
    mount = ClassKitchenMount(s.class_model, s.class_key, extensions=extensions) if s.class_model else None
    rooms = KitchenRooms(s.class_key, extensions) if s.kitchens else None
    if mount is None and rooms is None:
        return [], None
    _SERVED.append(AppKitchens(mount, rooms))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if mount is not None:
            threading.Thread(target=mount.start, daemon=True, name="class-kitchen-loader").start()
        try:
            yield {}
        finally:
            for m in (mount, rooms):
                if m is not None:
                    m.close()

    routes = [Mount(base + PREFIX, app=mount)] if mount is not None else []
    if rooms is not None:
        routes.append(Mount(base + KITCHENS + "/{model}/{device}/{precision}", app=rooms))
    return routes, lifespan

"""The app's own kitchen server, inside the app's server: the class kitchen and the Kitchen's kitchens.

One command and one address for a workshop: the app at http://HOST:8501/ and, on the same port,
the class kitchen server (serving/http/server.py) at http://HOST:8501/class/v1, with its board,
/class/metrics for the pass and /class/health. The Kitchen page cooks in the same kitchens: the
class's when it cooks the class's model on the CPU in float32, so its orders join the class's
batch, and otherwise a kitchen opened on demand (served at /kitchens/MODEL/DEVICE/PRECISION;
catalog names only, at most `MAX_KITCHENS` at once, the least recently used idle one closed for a
new one). Each kitchen's engine runs in its own kitchen-loop process, pinned to the engine's cores
(serving/cores.py); the app's server process only routes requests to it. What to mount comes
from the launcher's `AppSettings` (serving/app_settings.py): `kitchens` (the Kitchen's, unless
--backend), `class_model` and `class_key` (the class kitchen and its API key); the caps are the
instructor's (serving/caps.py), owned by each host.

A kitchen loads in a background thread, so the app opens at once; until its model is ready every
request to it gets a 503 with one line saying so.

The Kitchen page runs in this same process, so it does not order over HTTP: `served_here()` hands
it these kitchens and `AppHosts.host_for(...)` the chosen one's `EngineHost` itself, which the
page calls directly (the routes above are an adapter over the same object, for the class's
students and any other client).
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
from engine.settings import precision_settings
from serving.app_settings import AppSettings
from serving.caps import load_caps
from serving.catalog import load_catalog
from serving.cores import engine_threads, pin_this_process, split_cores
from serving.host.api import NotReady
from serving.host.host import EngineHost
from serving.host.loop import LoopSettings
from serving.http.openai_routes import ServerConfig
from serving.http.server import create_app, open_host

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
    if AppSettings.current().class_model == model and (device, dtype) == (CLASS_DEVICE, CLASS_DTYPE):
        return PREFIX
    return f"{KITCHENS}/{quote(model, safe='')}/{quote(device, safe='')}/{dtype}"


def loop_settings(model: str, device: str, dtype: str) -> LoopSettings:
    """The loop's settings in the app: the engine's threads on cores of their own, and (with the
    launcher's `pin_server`) this server's threads moved off them."""
    threads = engine_threads()
    split = split_cores(threads)
    if split is not None and AppSettings.current().pin_server:
        pin_this_process(split.server)
    invariant = AppSettings.current().batch_invariant and device == "cpu" and dtype == "float32"  # where it can hold
    engine = precision_settings(dtype, device=device, policy="chunked", token_budget=TOKEN_BUDGET,
                                max_seq_len=SEAT_TOKENS, prefix_cache=True, batch_invariant=invariant)  # fmt: skip
    return LoopSettings(model, engine, threads, tuple(sorted(split.engine)) if split is not None else ())


class HostMount:
    """One host as an ASGI app (the class's at /class): a one-line 503 until it is ready, then its server."""

    def __init__(self, host: EngineHost, api_key: str | None):
        self.host, self.api_key = host, api_key
        self.app = None
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send) -> None:
        host = self.host
        host.used_at = time.monotonic()
        if not host.ready:
            await refuse(send, 503, host.status)
            return
        with self._lock:
            if self.app is None:
                self.app = create_app(host, ServerConfig(host.name, self.api_key, host.caps))
        await self.app(scope, receive, send)


async def refuse(send, status: int, line: str) -> None:
    """A one-line JSON error (OpenAI's error object), without a router."""
    kind = "server_error" if status >= 500 else "not_found_error"
    body = json.dumps({"error": {"message": line, "type": kind, "param": None, "code": status}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


class HostRooms:
    """The ASGI app at /kitchens/{model}/{device}/{precision}: that host, opened on first use."""

    def __init__(self, api_key: str | None, sweeps=None):
        self.api_key, self.sweeps = api_key, sweeps
        self.rooms: OrderedDict[tuple[str, str, str], HostMount] = OrderedDict()
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

    def room(self, key: tuple[str, str, str]) -> tuple[HostMount | None, str]:
        with self.lock:
            if key in self.rooms:
                self.rooms.move_to_end(key)
                return self.rooms[key], ""
            if len(self.rooms) >= MAX_KITCHENS:
                idle = next((k for k, r in self.rooms.items() if r.host.idle or r.host.failed), None)
                if idle is None:
                    return None, (f"this server already runs {MAX_KITCHENS} kitchens and every one is cooking; "
                                  "try again when an order is done")  # fmt: skip
                self.rooms.pop(idle).host.close()
            host = open_host(key[0], loop_settings(key[0], key[1], key[2]), load_caps(None), self.sweeps)
            room = self.rooms[key] = HostMount(host, self.api_key)
        return room, ""

    def close(self) -> None:
        with self.lock:
            rooms, self.rooms = list(self.rooms.values()), OrderedDict()
        for room in rooms:
            room.host.close()


def warm(rooms: HostRooms, names: tuple[str, ...], first: EngineHost | None = None, poll_s: float = 0.5) -> list[str]:
    """Open the float32 CPU kitchen of each catalog model in `names` before anyone orders from it, so
    that choosing it finds its weights already loaded; returns the names opened.

    Why: after a restart, choosing the assistant would otherwise wait for its engine process to load
    538 MB of weights, most of a first answer's time (docs/models.md measures both). The launcher names the models it fetches
    in the background (the assistant); one still being fetched is opened when its fetch lands, one
    neither cached nor being fetched (offline, a failed fetch) is left to the page, which says why.
    `first` (the class kitchen, the chef) is waited for, so the page a teacher opens first is not
    slowed by a model they may never pick.

        warm(rooms, ("assistant",))  ->  ["assistant"]   # rooms.rooms now holds its kitchen, loading
    """
    from engine import model_store  # lazy: only a launch that fetches warms

    if first is not None:
        first.wait_ready()  # loaded, failed or closed
    opened = []
    for name in names:
        if kitchen_path(name, CLASS_DEVICE, CLASS_DTYPE) == PREFIX:
            continue  # the class kitchen cooks it, and is loaded already
        try:
            entry = load_catalog().get(name)
        except EngineError:
            continue
        if entry.kind == "fetch":
            while model_store.cached(entry.source) is None and model_store.fetching(entry.source):
                time.sleep(poll_s)
            if model_store.cached(entry.source) is None:
                continue
        room, _ = rooms.room((name, CLASS_DEVICE, CLASS_DTYPE))
        if room is not None:
            opened.append(name)
    return opened


class AppHosts:
    """The hosts this process serves: the class's (`mount`) and the Kitchen's rooms (`rooms`)."""

    def __init__(self, mount: HostMount | None, rooms: HostRooms | None):
        self.mount, self.rooms = mount, rooms

    def host_for(self, model: str, device: str, dtype: str) -> EngineHost:
        """The host that cooks this choice, opened on first use (it may still be loading: its calls
        raise `NotReady` until it is ready); `EngineError` (one line) when it cannot be opened."""
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
        room.host.used_at = time.monotonic()
        return room.host


_SERVED: list[AppHosts] = []  # what class_kitchen() mounted in this process


def served_here() -> AppHosts | None:
    """The hosts mounted in this process (`two-pot-kitchen` serves serve.py), or None (plain
    `streamlit run app.py`, page tests, before `own_hosts()`)."""
    return _SERVED[-1] if _SERVED else None


_OWN_LOCK = threading.Lock()


def own_hosts(sweeps=None) -> AppHosts:
    """This process's hosts for the Kitchen: the ones serve.py mounted, or, under plain
    `streamlit run app.py` (nothing mounted), the same rooms opened here on first use with no
    routes (the Kitchen calls them in process). Either way one code path cooks."""
    with _OWN_LOCK:
        here = served_here()
        if here is None or here.rooms is None:
            here = AppHosts(here.mount if here is not None else None, HostRooms(None, sweeps))
            _SERVED.append(here)
        return here


def class_kitchen(base: str = "", sweeps=None) -> tuple[list, object | None]:
    """(routes, lifespan) for serve.py's st.App, under Streamlit's base path `base` (e.g. "/kitchen"):
    the class kitchen at /class when the launcher named one, and the Kitchen's kitchens at
    /kitchens/... when it asked for them; each host with `sweeps` (the Lab's, lab/sweeps.py)."""
    s = AppSettings.current()
    mount = None
    if s.class_model:
        host = open_host(s.class_model, loop_settings(s.class_model, CLASS_DEVICE, CLASS_DTYPE), load_caps(None), sweeps)
        mount = HostMount(host, s.class_key)
    rooms = HostRooms(s.class_key, sweeps) if s.kitchens else None
    if mount is None and rooms is None:
        return [], None
    _SERVED.append(AppHosts(mount, rooms))
    if rooms is not None and s.warm:
        first = mount.host if mount is not None else None
        threading.Thread(target=warm, args=(rooms, s.warm, first), daemon=True, name="kitchen-warmer").start()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield {}
        finally:
            if mount is not None:
                mount.host.close()
            if rooms is not None:
                rooms.close()

    routes = [Mount(base + PREFIX, app=mount)] if mount is not None else []
    if rooms is not None:
        routes.append(Mount(base + KITCHENS + "/{model}/{device}/{precision}", app=rooms))
    return routes, lifespan

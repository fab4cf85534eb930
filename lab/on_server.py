"""The Lab on a kitchen server: an experiment's sweep in the server's own engine process.

The server (serving/server.py) knows nothing of the lab (imports point lab -> serving); whoever
starts a server with the Lab passes `LabRoutes` among its extensions: `two-pot-kitchen serve`
(kitchen_viz/launch.py) and the app's own kitchens (serve.py).

A sweep needs the engine in hand for seconds to minutes (controlled batches, the profiler, the
process's CPU time, caches and layouts a class kitchen does not run), so it does not join the
class's batch: it is a job kind of the kitchen's own loop (serving/kitchen_loop.py `RunSweep`),
run between orders on an engine of its own in the loop's process, and streamed back:

    POST /kitchen/lab/{key}   {"settings": <the experiment's settings, serving/lab_wire.py>}
      -> server-sent events: {"progress": ...} as points finish, then {"result": ...} and [DONE];
         a failure is one {"error": {...}} event

So `two-pot-kitchen --backend http://GPU-BOX:8000` runs the Lab's sweeps on the GPU box, and the
app's own server runs them for it locally: one code path. Refusals are one line before the
stream starts: 404 an unknown experiment, 422 settings that are not that experiment's. A client
that hangs up cancels the sweep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from engine.errors import EngineError
from lab.registry import experiment
from serving.handles import Handle
from serving.kitchen_orders import sse_stream
from serving.lab_wire import decode, encode
from serving.openai_api import ApiError


class LabRoutes:
    def __init__(self, kitchen):
        """`kitchen`: serving.server.Kitchen (its engine client runs the sweeps in its kitchen loop).
        An extension of the server: `routes()` are mounted, `close()` runs when the server stops."""
        self.kitchen = kitchen

    def routes(self) -> list[Route]:
        return [Route("/kitchen/lab/{key}", self.run, methods=["POST"])]

    async def start(self, key: str, settings, run: Callable | None = None) -> Handle:
        """Check a sweep's settings and queue it in the kitchen loop; returns its handle. `run`: the
        experiment's own function when a caller in this process has one the registry lacks."""
        if run is None:
            run = known(key).run
        if type(settings).__module__ != run.__module__:
            raise ApiError(422, f"field 'settings' must be the settings of experiment '{key}' "
                                f"(got {type(settings).__name__})", "settings")  # fmt: skip
        try:
            return await self.kitchen.client.run_sweep(run, settings)
        except EngineError as err:
            raise ApiError(503, str(err), kind="server_error") from None

    def cancel(self, handle: Handle) -> None:
        self.kitchen.client.cancel(handle.key)

    async def messages(self, handle: Handle) -> AsyncIterator[dict]:
        """{"progress": record} as points finish, then {"result": result}, or one {"error": {...}}.
        Closing the iterator early cancels the sweep."""
        try:
            async for kind, value in handle:
                if kind == "progress":
                    yield {"progress": value}
                elif kind == "done":
                    yield {"result": value}
                else:
                    yield ApiError(500, value or "the sweep failed", kind="engine_error").body()
        finally:
            if not handle.finished:
                self.cancel(handle)

    async def run(self, request: Request) -> Response:
        key = request.path_params["key"]
        known(key)
        body = await self.kitchen._json(request)
        if not isinstance(body, dict) or "settings" not in body:
            raise ApiError(422, "field 'settings' is required: the experiment's settings", "settings")
        try:
            settings = decode(body["settings"])
        except (ValueError, TypeError) as err:
            raise ApiError(422, f"field 'settings' cannot be read: {err}", "settings") from None
        handle = await self.start(key, settings)
        stream = sse_stream(request, self.messages(handle), lambda: self.cancel(handle), encode=wire)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def close(self) -> None:
        """Nothing of its own to stop: the sweeps ran in the kitchen's loop."""


def known(key: str):
    """The experiment with this key, or a 404 naming the known ones."""
    try:
        return experiment(key)
    except KeyError as err:
        raise ApiError(404, str(err).strip("'\""), kind="not_found_error") from None


def wire(msg: dict) -> dict:
    """A sweep's message as JSON (serving/lab_wire.py); a result this server cannot send is one line."""
    if "error" in msg:
        return msg
    try:
        return {k: encode(v) for k, v in msg.items()}
    except TypeError as err:
        return ApiError(500, f"the result of this sweep cannot be sent: {err}", kind="engine_error").body()

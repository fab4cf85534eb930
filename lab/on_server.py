"""The Lab on a kitchen server: an experiment's sweep in the server's own engine process.

The server (serving/server.py) knows nothing of the lab (imports point lab -> serving); whoever
starts a server with the Lab passes `LabRoutes` among its extensions: `two-pot-kitchen serve`
(kitchen_viz/launch.py) and the app's own kitchens (serve.py).

A sweep needs the engine in hand for seconds to minutes (controlled batches, the profiler, the
process's CPU time, caches and layouts a class kitchen does not run), so it does not join the
class's batch: the server runs it the way the app runs it alone, in a private engine process of
its own (serving/service.py, one job at a time, behind the machine's stove), and streams it back:

    POST /kitchen/lab/{key}   {"settings": <the experiment's settings, serving/lab_wire.py>}
      -> server-sent events: {"progress": ...} as points finish, then {"result": ...} and [DONE];
         a failure is one {"error": {...}} event

So `two-pot-kitchen --backend http://GPU-BOX:8000` runs the Lab's sweeps on the GPU box, and the
app's own server runs them for it locally: one code path. Refusals are one line before the
stream starts: 404 an unknown experiment, 422 settings that are not that experiment's. A client
that hangs up cancels the sweep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from lab.registry import LabRun, experiment
from serving.cores import engine_threads
from serving.job import Job
from serving.kitchen_orders import sse_stream
from serving.lab_wire import decode, encode
from serving.openai_api import ApiError
from serving.service import PAGE_GONE, KitchenService

POLL_S = 0.2  # how often the stream looks for new progress


class LabRoutes:
    def __init__(self, kitchen):
        """`kitchen`: serving.server.Kitchen (its engine client names the model, device and dtype).
        An extension of the server: `routes()` are mounted, `close()` runs when the server stops."""
        self.kitchen = kitchen
        self._svc = None
        self._lock = threading.Lock()

    def routes(self) -> list[Route]:
        return [Route("/kitchen/lab/{key}", self.run, methods=["POST"])]

    def service(self):
        """The server's private kitchen for sweeps, started at the first one (it loads its own copy)."""
        with self._lock:
            if self._svc is None:
                s = self.kitchen.client.settings
                self._svc = KitchenService(s.model, s.device, s.dtype, threads=engine_threads())
            return self._svc

    def start(self, key: str, settings, run: Callable | None = None) -> Job:
        """Check a sweep's settings and queue it in the private kitchen; returns its job. `run`: the
        experiment's own function when a caller in this process has one the registry lacks."""
        title = key
        if run is None:
            exp = known(key)
            run, title = exp.run, exp.title
        if type(settings).__module__ != run.__module__:
            raise ApiError(422, f"field 'settings' must be the settings of experiment '{key}' "
                                f"(got {type(settings).__name__})", "settings")  # fmt: skip
        return self.service().submit(LabRun(key, settings, run=run), label=f"lab: {title}")

    async def messages(self, job) -> AsyncIterator[dict]:
        """{"progress": record} as points finish, then {"result": result}, or one {"error": {...}}.
        Closing the iterator early cancels the sweep."""
        seen = 0
        try:
            while True:
                finished = job.finished  # read before the events, so none is missed
                events = job.events[seen:]
                seen += len(events)
                for ev in events:
                    yield {"progress": ev}
                if finished:
                    break
                await asyncio.sleep(POLL_S)
            if job.status == "done":
                yield {"result": job.result}
            else:
                kind = "cancelled_error" if job.status == "cancelled" else "engine_error"
                yield ApiError(500, job.error or "the sweep failed", kind=kind).body()
        finally:
            if not job.finished:
                job.cancel(PAGE_GONE)

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
        job = self.start(key, settings)
        stream = sse_stream(request, self.messages(job), lambda: job.cancel(PAGE_GONE), encode=wire)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def close(self) -> None:
        if self._svc is not None:
            self._svc.close()


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

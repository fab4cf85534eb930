"""The class kitchen's key: with `--api-key`, every route that touches orders needs it.

Open without a key: `/health` (a load balancer's or the launcher's probe) and `/metrics` (counts
and histograms, never a prompt, a text or an id: Prometheus scrapes it as docs/prometheus.yml
says). Everything else (the OpenAI
routes, the board, the Kitchen's orders, the kitchen's settings, the Lab) answers 401 with one
line to a missing or wrong `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import secrets

from starlette.responses import JSONResponse

from serving.http.openai_api import ApiError

OPEN_PATHS = ("/health", "/metrics")


class KeyCheck:
    """ASGI middleware; inside a mount (serving/http/mounted.py) the paths are the mount's own."""

    def __init__(self, app, key: str | None, open_paths: tuple[str, ...] = OPEN_PATHS):
        self.app, self.key, self.open_paths = app, key, open_paths

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")[len(scope.get("root_path", "")) :]
        if self.key and scope["type"] == "http" and path.rstrip("/") not in self.open_paths:
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"").decode(errors="replace")
            if not secrets.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
                err = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                               kind="authentication_error")  # fmt: skip
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)

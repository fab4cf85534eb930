"""The class kitchen: one engine, one continuous batch, served over HTTP to a whole class.

    two-pot-kitchen serve --model chef --policy chunked --host 0.0.0.0 --port 8000 --api-key KEY

Every student's order joins the same running batch (serving/host/loop.py steps it in its own
process), so the class itself is the dinner rush the lessons are about. The routes are an adapter
over the host (serving/host/host.py `EngineHost`), the same object the app's own pages call directly. The API is OpenAI's, so
the `openai` client, curl, vLLM's benchmark scripts and the app itself can all order:

    POST /v1/completions, /v1/chat/completions   streaming (SSE, `data: [DONE]`) or not
    GET  /v1/models                              the served model (clients never name a path)
    GET  /health                                 200 when the engine is ready, else 503
    GET  /metrics                                Prometheus text (serving/http/metrics.py)
    GET  /kitchen                                the policy, seats and the instructor's caps in force
    GET  /kitchen/board?order=ID&since=N         the whole class in the pot: tickets (yours marked when
                                                 you name your order's id), recent steps, the kitchen's
                                                 TTFT and TPOT (serving/http/board.py)
    POST /kitchen/orders (and /kitchen/model, /limits, /check)
                                                 the Kitchen page's order of B tables in the same batch,
                                                 every engine event streamed (serving/http/order_routes.py)
    POST /kitchen/lab/{key}                      a Lab sweep in the server's own engine process, its
                                                 progress streamed (the host runs the experiments it
                                                 was started with: lab/sweeps.py)

Requests may leave out `model` (the one served here); chat content may be text or a list of text
parts; `max_completion_tokens`, vLLM's `ignore_eos` and `min_tokens`, and `logprobs` (with
`top_logprobs` on chat) are honoured, the logprobs being the engine's own (serving/http/answer.py).

Errors are one line in OpenAI's error object: 400 a request the kitchen refuses (over the context,
the KV memory or an instructor's cap), 401 a wrong key (serving/http/auth.py), 404 an unknown model or
path, 413 a body over the size limit, 422 a malformed body (naming the field), 503 with
`Retry-After` when the line waiting for a seat is at the instructor's bound (serving/http/admission.py). A client that disconnects has its
sequences cancelled; an order past the instructor's time limit is cancelled and its stream ends
with an error event; if the engine process dies, streams in flight end with an error event
naming it and a new engine is started.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.errors import EngineError, OneLineParser
from engine.loader import EMBEDDED_MODELS
from engine.settings import precision_settings
from serving.caps import load_caps
from serving.catalog import resolve_source
from serving.heap import freeze_heap
from serving.host.host import EngineHost
from serving.host.loop import LoopSettings
from serving.http.admission import Full
from serving.http.auth import KeyCheck
from serving.http.board import ClassBoard
from serving.http.fair import OverCap
from serving.http.metrics import HostMetrics
from serving.http.openai_api import ApiError
from serving.http.openai_routes import OpenAIRoutes, ServerConfig
from serving.http.order_routes import OrderRoutes

__all__ = ["ServerConfig", "create_app", "main", "open_host", "served_name"]


def create_app(host: EngineHost, config: ServerConfig) -> Starlette:
    """The server's app over a ready host: OpenAI's routes, the status routes, the Kitchen's and the Lab's."""
    api = OpenAIRoutes(host, config)

    async def api_error(request: Request, err: ApiError) -> Response:
        headers = {"Retry-After": str(err.retry_after)} if isinstance(err, Full | OverCap) else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    async def unexpected(request: Request, err: Exception) -> Response:  # a bug: still one line, no traceback
        line = " ".join(f"{type(err).__name__}: {err}".split())
        return JSONResponse(ApiError(500, line, kind="server_error").body(), status_code=500)

    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.prometheus, methods=["GET"]),
        Route("/kitchen", api.about, methods=["GET"]),
        Route("/kitchen/board", api.board, methods=["GET"]),
        *OrderRoutes(api).routes(),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, Exception: unexpected})
    app.add_middleware(KeyCheck, key=config.api_key)
    return app


def open_host(model: str, settings: LoopSettings, caps, sweeps=None, label: str = "this server's own kitchen") -> EngineHost:
    """A host for a catalog name, `preset:NAME` or a folder, with a class board and metrics of its own;
    it starts loading at once (`host.wait_ready`)."""
    name, source = served_name(model)
    return EngineHost(name, replace(settings, model=source), caps, HostMetrics(name), ClassBoard(), sweeps, label)


# -- the command ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="two-pot-kitchen serve", description="one kitchen server for a whole class")
    p.add_argument("--model", default="chef", help="a catalog name (chef, assistant, ...), preset:NAME, a local model "
                                                   "folder or a .gguf file")  # fmt: skip
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | int8 (int8 weight matrices)")
    p.add_argument("--policy", default="chunked", help="static | continuous | chunked")
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--max-seqs", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-prefix-cache", action="store_true", help="recompute shared prompt prefixes every time")
    p.add_argument("--batch-invariant", action="store_true",
                   help="every answer the same bits as its prompt served alone (float32 on CPU; slower at one row)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--config", default=None, help="the instructor's caps (TOML with a [caps] table)")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="requests that may wait for a seat before one is refused with 503 (default: the caps "
                        "file's max_waiting, else 2048)")
    return p


def served_name(model: str) -> tuple[str, str]:
    """(what clients call it, what Engine.load gets): a catalog name keeps its name; a folder is
    served under its own name, so no path ever appears in the API."""
    source = resolve_source(model)
    if source is not None:  # an embedded model keeps its name, so the engine's info says "chef", not a folder
        embedded = EMBEDDED_MODELS / model
        return model, model if Path(source).resolve() == embedded.resolve() else source
    return (Path(model).name if Path(model).is_dir() else Path(model).stem if model.endswith(".gguf") else model), model


def main(argv: list[str] | None = None, sweeps=None) -> int:
    """`two-pot-kitchen serve`; `sweeps` runs the Lab's experiments (lab/sweeps.py) when the launcher has the Lab."""
    import uvicorn  # lazy: uvicorn only when serving

    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        caps = load_caps(args.config)
        if args.max_waiting is not None:
            if args.max_waiting < 0:
                raise EngineError(f"--max-waiting must be 0 or more requests (got {args.max_waiting})")
            caps = replace(caps, max_waiting=args.max_waiting)
        from engine.cli import fetch_first  # lazy: the command line only

        fetch_first(served_name(args.model)[1])  # a fetched model (assistant) not yet cached: fetched here, with a progress bar
        engine = precision_settings(args.dtype, device=args.device, policy=args.policy, token_budget=args.token_budget,
                                    max_seqs=args.max_seqs, prefix_cache=not args.no_prefix_cache,
                                    batch_invariant=args.batch_invariant)  # fmt: skip
        engine.check()
        print(f"loading {args.model} on {args.device} ({args.dtype}, policy {args.policy})...", file=sys.stderr)
        host = open_host(args.model, LoopSettings(args.model, engine, args.threads), caps, sweeps)
        if not host.wait_ready():
            raise EngineError(host.status)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    name = host.name
    app = create_app(host, ServerConfig(name, args.api_key, caps))
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"the class kitchen is open at http://{_address(args.host)}:{args.port}/v1 (model '{name}')", file=sys.stderr)
        if not args.api_key:
            print("warning: no --api-key: anyone who can reach this address can order", file=sys.stderr)
    else:
        print(f"the kitchen is open at http://{args.host}:{args.port}/v1 (model '{name}')", file=sys.stderr)
    freeze_heap()  # what startup loaded stays out of the full collections that would pause every stream
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        host.close()
    return 0


def _address(host: str) -> str:
    """The address to share with the class: this machine's outward-facing IP for 0.0.0.0."""
    if host not in ("0.0.0.0", "::"):
        return host
    import socket  # lazy: the command line only

    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return host


if __name__ == "__main__":
    sys.exit(main())

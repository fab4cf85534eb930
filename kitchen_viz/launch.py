"""`two-pot-kitchen`: start the Streamlit app with the right flags.

Why a launcher: learners should type one command, not remember `streamlit run` flags, and an
instructor should be able to add catalog entries (`--catalog extra.toml`) and set the caps per
order (`--caps caps.toml`, serving/caps.py) without touching files in the repo. Any other option is handed to Streamlit unchanged, so

    two-pot-kitchen --server.port 8600 --catalog ~/class/models.toml

runs `streamlit run <repo>/serve.py --server.port 8600 -- --app-settings FILE` with the extra
catalog merged in: the launcher resolves every setting into one `AppSettings` (its command line
over `--settings app.toml` over the defaults; serving/app_settings.py), checks the instructor's
files now, and writes the result to a file of this user's only, which the app's process reads.
serve.py is app.py plus the live view's feed route (kitchen_viz/live_feed.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlparse

from engine.errors import EngineError
from lab.sweeps import LabSweeps
from serving.app_settings import HANDOFF_FLAG, AppSettings
from serving.caps import load_caps
from serving.catalog import Entry, check_extra_catalogs, load_catalog
from serving.http.server import main as serve_main

APP = Path(__file__).resolve().parent / "web" / "app.py"
SERVE = APP.parent / "serve.py"  # app.py served through st.App, with the live feed's route
PREFETCH_ENV = "TWO_POT_PREFETCH"  # "0": no background fetch at launch (the test suite sets it)
DEFAULT_FLAGS = ["--server.headless", "true", "--browser.gatherUsageStats", "false"]


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="two-pot-kitchen",
        description="Open the Two-Pot Kitchen (prefill = the wok, decode = the soup pot) in your browser.",
        epilog="Other options (e.g. --server.port 8600, --server.address 0.0.0.0) go to `streamlit run`.",
    )
    parser.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="TOML",
        help="an extra model catalog to merge into the menu (repeatable)",
    )
    parser.add_argument(
        "--caps",
        metavar="TOML",
        help="the instructor's caps per order: a [caps] table (max_order_tokens, max_new_tokens, "
        "max_order_seconds); see serving/caps.py",
    )
    parser.add_argument(
        "--backend",
        metavar="URL",
        help="an OpenAI-compatible server (two-pot-kitchen serve, vLLM, llama.cpp) for the class kitchen pages",
    )
    parser.add_argument("--api-key", metavar="KEY", help="the --backend server's API key")
    parser.add_argument(
        "--class-kitchen",
        nargs="?",
        const="chef",
        metavar="MODEL",
        help="the model of the class kitchen (OpenAI-compatible, one continuous batch for the whole class) "
        "served on the app's own port at /class/v1 (default: chef)",
    )
    parser.add_argument("--no-class-kitchen", action="store_true", help="do not start the class kitchen")
    parser.add_argument("--class-key", metavar="KEY", help="the API key students send to the class kitchen")
    parser.add_argument("--presenter", action="store_true", help="start every session in presenter mode")
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="float32 CPU kitchens answer every prompt with the same bits as if it were alone "
        "(engine/invariance.py; slower for a lone order)",
    )
    parser.add_argument("--threads", type=int, default=0, metavar="N",
                        help="the engine's torch threads (default: every core but one)")  # fmt: skip
    parser.add_argument("--no-pin", action="store_true",
                        help="let the engine and the app share every core (no core split)")  # fmt: skip
    parser.add_argument(
        "--settings",
        metavar="TOML",
        help="an [app] table of these settings (backend, backend_key, class_model, class_key, presenter, "
        "batch_invariant, threads, pin), and optionally a [caps] table and [[model]] entries; "
        "the command line wins over it (serving/app_settings.py)",
    )
    parser.add_argument(
        "--no-fetch", action="store_true",
        help="do not start fetching the catalog's fetched models (the assistant) in the background, "
             "nor load them before their first order",
    )
    parser.add_argument(
        "--print-command", action="store_true", help="print the streamlit command instead of running it"
    )
    return parser.parse_known_args(argv)


def server_address(passthrough: list[str]) -> str | None:
    """The --server.address handed to Streamlit (either spelling), or None when not given."""
    for i, arg in enumerate(passthrough):
        if arg.startswith("--server.address="):
            return arg.split("=", 1)[1]
        if arg == "--server.address" and i + 1 < len(passthrough):
            return passthrough[i + 1]
    return None


def streamlit_command(passthrough: list[str], settings_file: Path | None = None) -> list[str]:
    """`python -m streamlit run <repo>/serve.py` with our defaults, overridable by the caller's flags,
    and the app's settings file as the script's argument."""
    given = {arg.split("=")[0] for arg in passthrough if arg.startswith("--")}
    defaults = []
    for flag, value in zip(DEFAULT_FLAGS[::2], DEFAULT_FLAGS[1::2], strict=True):
        if flag not in given:
            defaults += [flag, value]
    script_args = ["--", HANDOFF_FLAG, str(settings_file)] if settings_file is not None else []
    return [sys.executable, "-m", "streamlit", "run", str(SERVE), *defaults, *passthrough, *script_args]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # the class kitchen server (serving/http/server.py), no Streamlit
        return serve_main(argv[1:], sweeps=LabSweeps())  # the kitchen server runs the Lab's sweeps too
    args, passthrough = parse(argv)
    if not (APP.is_file() and SERVE.is_file()):
        print(
            f"two-pot-kitchen: app not found at {APP.parent} (is the package installed from the repo?)",
            file=sys.stderr,
        )
        return 2
    try:
        base = AppSettings.from_toml(args.settings) if args.settings else AppSettings()
    except EngineError as err:
        print(f"two-pot-kitchen: {err}", file=sys.stderr)
        return 2
    backend = args.backend or base.backend
    if backend and (urlparse(backend).scheme not in ("http", "https") or not urlparse(backend).hostname):
        print(f"two-pot-kitchen: --backend must be a URL like http://HOST:8000 (got '{backend}')", file=sys.stderr)
        return 2
    if backend and args.class_kitchen:
        print("two-pot-kitchen: --backend and --class-kitchen both name the class kitchen: choose one",
              file=sys.stderr)  # fmt: skip
        return 2
    # Without --backend the Kitchen cooks in the app's own kitchens (serving/http/mounted.py), and the
    # class pages order from the class kitchen mounted beside them unless --no-class-kitchen.
    classroom = not backend and not args.no_class_kitchen
    settings = AppSettings(
        backend=backend.rstrip("/").removesuffix("/v1") if backend else None,
        backend_key=args.api_key,
        kitchens=not backend,
        class_model=(args.class_kitchen or base.class_model or "chef") if classroom else None,
        class_key=args.class_key,
        presenter=args.presenter,
        batch_invariant=args.batch_invariant,
        # The served app keeps its own threads off the engine's cores (serving.cores.split_cores);
        # in-process page tests (AppTest) never run this, so the test runner is never pinned.
        pin_server=not args.no_pin,
        pin=not args.no_pin,
        threads=args.threads,
        caps=str(Path(args.caps).resolve()) if args.caps else None,
        catalogs=tuple(args.catalog),
    ).over(replace(base, class_model=None) if not classroom else base)
    try:  # the instructor's files are checked now (fail fast), not at the app's first page
        if args.threads < 0:
            raise EngineError(f"--threads must be 0 (every core but one) or more (got {args.threads})")
        settings = replace(settings, catalogs=check_extra_catalogs(list(settings.catalogs)))
        if settings.caps:
            load_caps(settings.caps)
    except EngineError as err:
        print(f"two-pot-kitchen: {err}", file=sys.stderr)
        return 2
    if settings.class_model and not settings.class_key and \
            server_address(passthrough) not in (None, "127.0.0.1", "localhost", "::1"):  # fmt: skip
        print("two-pot-kitchen: warning: no --class-key: anyone who can reach this address can order "
              "from the class kitchen", file=sys.stderr)  # fmt: skip
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    prefetch = settings.kitchens and not args.no_fetch and os.environ.get(PREFETCH_ENV, "1") != "0"
    fetched = fetched_entries() if prefetch else []
    # What is fetched in the background is also loaded ahead of its first order (mounted.warm).
    settings = replace(settings, warm=tuple(e.name for e in fetched))
    cmd = streamlit_command(passthrough, settings.write())
    if args.print_command:
        print(" ".join(cmd))
        return 0
    for name in fetch_in_background(fetched):
        print(f"two-pot-kitchen: fetching the {name} model in the background (once; the sidebar shows "
              f"its progress)", file=sys.stderr)  # fmt: skip
    os.chdir(APP.parent)  # .streamlit/config.toml (themes) is read from the working directory
    os.execv(cmd[0], cmd)
    return 0  # not reached


def fetched_entries() -> list[Entry]:
    """The catalog's models fetched on first use (the assistant)."""
    return [e for e in load_catalog().entries if e.kind == "fetch"]


def fetch_in_background(entries: list[Entry]) -> list[str]:
    """Start fetching each of these catalog entries (fetched on first use: the assistant) that is not
    yet cached, each in a process of its own that outlives this one (which execs Streamlit): by the
    time a teacher picks it, it is ready. Returns the names started."""
    from engine import model_store  # lazy: only a launch that opens the app's own kitchens fetches

    return [e.source for e in entries if model_store.fetch_in_background(e.source)]


# -- for tests and benchmarks: the app as a background server -----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(port: int, log_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """Start `two-pot-kitchen` on 127.0.0.1:`port` in the background; returns (process, base URL)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [
        sys.executable,
        "-m",
        "kitchen_viz.launch",
        "--server.port",
        str(port),
        "--server.address",
        "127.0.0.1",
    ]
    with open(log_path, "w") as out:
        proc = subprocess.Popen([*cmd, *extra], cwd=APP.parent, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 90) -> bool:
    """Poll Streamlit's /_stcore/health until it answers "ok" (False on timeout or if the process died)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return True
        except OSError:
            time.sleep(0.5)
    return False


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


if __name__ == "__main__":
    raise SystemExit(main())

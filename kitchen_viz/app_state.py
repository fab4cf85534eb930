"""The app's shared state: which kitchen this browser session cooks in, and the server's run log.

Why this module: `app.py` draws the shared controls (model, device, dtype, seed, presenter mode)
once, in the sidebar, and every page reads them through `current_settings()`; the engine and the
run log are *server-wide* read-only-shared things, so they live in `st.cache_resource` (one kitchen
per model/device/dtype, one run log per server process), never in a session.

A page rendered on its own (AppTest on `pages/kitchen.py`) has no sidebar; it gets the defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import streamlit as st
import torch

from engine.errors import EngineError
from engine.loader import EMBEDDED_MODELS
from kitchen_viz.live_feed import base_path
from lab.runlog import RunLog
from lab.sweeps import LabSweeps
from serving.app_settings import AppSettings
from serving.catalog import load_catalog
from serving.clients.remote import RemoteHost
from serving.host.api import Host
from serving.host_client import HostClient
from serving.http.mounted import PREFIX, own_hosts

APP_DIR = Path(__file__).resolve().parent / "web"  # the Streamlit entry (app.py); page paths are relative to it
CHEF_FOLDER = EMBEDDED_MODELS / "chef"
DTYPES = ["float32", "bfloat16", "float16"]
PRECISIONS = [*DTYPES, "int8"]  # "int8": int8 weight matrices, float32 for the rest (engine/quant.py)
PRECISION_LABELS = {"int8": "int8 weights (float32 KV)"}

# Session-state keys of the shared controls (app.py's widgets use exactly these keys).
KEY_MODEL, KEY_DEVICE, KEY_DTYPE, KEY_SEED, KEY_PRESENTER = (
    "tpk_model",
    "tpk_device",
    "tpk_dtype",
    "tpk_seed",
    "tpk_presenter",
)


@dataclass(frozen=True)
class Settings:
    model: str  # a catalog name ("chef") or, without a catalog, the chef's folder
    device: str
    dtype: str
    seed: int
    presenter: bool


@dataclass(frozen=True)
class ModelChoice:
    name: str  # what Engine.load receives
    label: str  # what the select box shows
    trained: bool


def model_choices() -> list[ModelChoice]:
    """The models the browser may pick: the catalog's entries, in its order (chef first).

    A broken catalog (an instructor's extra file with a typo, say) raises its one-line
    `EngineError`; the entry point shows it and falls back to `fallback_choices()`.
    """
    cat = load_catalog()
    default = cat.default.name
    entries = sorted(cat.entries, key=lambda e: e.name != default)
    return [ModelChoice(e.name, e.label or e.name, bool(e.trained)) for e in entries]


def fallback_choices() -> list[ModelChoice]:
    """Only the embedded chef: the app still opens on a real model when the catalog cannot be read."""
    return [ModelChoice(str(CHEF_FOLDER), "chef (embedded)", True)]


def safe_model_choices() -> tuple[list[ModelChoice], str | None]:
    """(choices, problem): the catalog's models, or the chef alone plus the catalog's one-line error."""
    try:
        return model_choices(), None
    except EngineError as err:
        return fallback_choices(), str(err)


def device_choices() -> list[str]:
    """Devices this server can actually use: the CPU, plus each CUDA GPU torch can see."""
    gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return ["cpu", *gpus]


def current_settings() -> Settings:
    """The shared controls' values for this session (defaults when the sidebar was not drawn)."""
    ss = st.session_state
    return Settings(
        model=ss.get(KEY_MODEL) or safe_model_choices()[0][0].name,
        device=ss.get(KEY_DEVICE) or "cpu",
        dtype=ss.get(KEY_DTYPE) or "float32",
        seed=int(ss.get(KEY_SEED) or 0),
        presenter=bool(ss.get(KEY_PRESENTER, AppSettings.current().presenter)),
    )


@st.cache_resource(show_spinner=False)
def run_log():
    """The server's log of every finished generation (the dashboard reads it)."""
    return RunLog()


def _close_kitchen(svc: HostClient) -> None:
    """A kitchen dropped from the cache cancels its orders and lets go of its host."""
    svc.close()


@st.cache_resource(show_spinner=False, max_entries=3, on_release=_close_kitchen)
def _service(model: str, device: str, dtype: str, backend: str | None) -> HostClient:
    """The session's kitchen (the Kitchen's orders and the Lab's sweeps), cached per choice and per
    `backend` (where it cooks): this process's own kitchen host, called in process whatever the
    launch, or `--backend`'s over HTTP, so every launch takes one path."""
    return HostClient(kitchen_host_for(model, device, dtype), model, device, dtype, run_log=run_log())


def kitchen_host_for(model: str, device: str, dtype: str) -> Host | Callable[[], Host]:
    """The host that cooks this choice: the launcher's `--backend` over HTTP (a Two-Pot kitchen
    server serves its one model), else this process's own host for it, called directly
    (serving/http/mounted.py: mounted by serve.py, or opened here under plain `streamlit run
    app.py`), each with the Lab's sweeps; found once the kitchen's client asks (it opens on first use)."""
    s = AppSettings.current()
    if s.backend:
        return RemoteHost(s.backend, s.backend_key)
    return lambda: own_hosts(LabSweeps()).host_for(model, device, dtype)


def service_for(settings: Settings) -> HostClient:
    """The one shared kitchen for this model/device/dtype; it starts loading at once.

    A kitchen whose model failed to load is dropped from the cache after the page has shown the
    reason, so fixing the problem (say, freeing memory) and reloading tries again.
    """
    svc = _service(settings.model, settings.device, settings.dtype, AppSettings.current().backend)
    if svc.state == "error":  # forget only this kitchen
        _service.clear(settings.model, settings.device, settings.dtype)  # type: ignore[attr-defined]
        svc.close()
    return svc


def seed_from_url(model_names: list[str]) -> str | None:
    """Before the sidebar's widgets exist: take the model (and presenter mode) from the link once per
    session, so a reload or a shared link keeps them (`?model=apprentice&presenter=1`).

    Returns a one-line reason when the link named a model that is not in the catalog (ignored).
    """
    ss = st.session_state
    if ss.get("tpk_url_seeded"):
        return None
    ss["tpk_url_seeded"] = True
    if "presenter" in st.query_params:
        ss[KEY_PRESENTER] = st.query_params["presenter"] not in ("0", "false", "no")
    wanted = st.query_params.get("model")
    if wanted is None:
        return None
    if wanted in model_names:
        ss[KEY_MODEL] = wanted
        return None
    return f"Ignored ?model={wanted}: not in this server's catalog ({', '.join(model_names)})."


def keep_model_in_url() -> None:
    """After the sidebar: the chosen model in the address bar, next to the order's values."""
    model = st.session_state.get(KEY_MODEL)
    if model and st.query_params.get("model") != model:
        st.query_params["model"] = model


def class_kitchen_address() -> tuple[str, str]:
    """(URL, API key) the class kitchen pages start with: the launcher's `--backend`, else the
    class kitchen mounted on this very server (`--class-kitchen`), else `two-pot-kitchen serve`'s
    default address."""
    s = AppSettings.current()
    if s.backend:
        return s.backend, s.backend_key or ""
    if s.class_model:
        port = st.get_option("server.port")
        return f"http://127.0.0.1:{port}{base_path()}{PREFIX}", s.class_key or ""
    return "http://127.0.0.1:8000", ""

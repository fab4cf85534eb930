"""The catalog: the allow-listed menu, its refusals (one line each) and the facts it computes without weights."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import CHEF_CONTEXT, use_settings

from engine.errors import EngineError
from serving.catalog import (
    MODELS_ROOT,
    RANDOM_WEIGHTS_NOTE,
    check_extra_catalogs,
    describe,
    fits,
    load_catalog,
    resolve_source,
)


@pytest.fixture(autouse=True)
def _no_extra_catalog(monkeypatch):
    use_settings(monkeypatch)  # the defaults: no instructor's catalog


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and msg
    return msg


def test_shipped_catalog_lists_chef_apprentice_and_presets():
    cat = load_catalog()
    assert cat.default.name == "chef"
    assert cat.names()[:2] == ["chef", "apprentice"]
    assert {"preset:smollm2-135m", "preset:qwen2.5-0.5b", "preset:llama-3.2-1b"} <= set(cat.names())
    chef = cat.get("chef")
    assert chef.trained and Path(chef.source) == (MODELS_ROOT / "chef").resolve()
    for e in cat.entries:
        if e.kind == "preset":
            assert not e.trained and RANDOM_WEIGHTS_NOTE in e.label
            assert e.source == e.name  # "preset:smollm2-135m" is both the name and what Engine.load takes


def test_resolve_source_maps_names_and_ignores_unlisted():
    cat = load_catalog()
    assert resolve_source("chef", cat) == str((MODELS_ROOT / "chef").resolve())
    assert resolve_source("preset:llama-3.2-1b", cat) == "preset:llama-3.2-1b"
    assert resolve_source("/etc/passwd", cat) is None


def test_unknown_name_lists_the_menu():
    with pytest.raises(EngineError) as e:
        load_catalog().get("gpt-5")
    msg = one_line_error(e)
    assert "gpt-5" in msg and "chef" in msg and "apprentice" in msg


def test_unknown_entry_key_is_refused(tmp_path):
    f = write(
        tmp_path / "extra.toml",
        """
        [[model]]
        name = "x"
        hub = "HuggingFaceTB/SmolLM2-135M"
        weights_url = "http://example.com"
    """,
    )
    with pytest.raises(EngineError) as e:
        load_catalog(extra_paths=(f,))
    assert "unknown key 'weights_url'" in one_line_error(e)


def test_unknown_file_key_is_refused(tmp_path):
    f = write(tmp_path / "extra.toml", "allow_everything = true\n")
    with pytest.raises(EngineError) as e:
        load_catalog(extra_paths=(f,))
    assert "unknown key 'allow_everything'" in one_line_error(e)


def test_duplicate_names_are_refused_across_files(tmp_path):
    f = write(
        tmp_path / "extra.toml",
        """
        [[model]]
        name = "chef"
        hub = "HuggingFaceTB/SmolLM2-135M"
    """,
    )
    with pytest.raises(EngineError) as e:
        load_catalog(extra_paths=(f,))
    msg = one_line_error(e)
    assert "duplicate model name 'chef'" in msg and "catalog.toml" in msg


def test_duplicate_names_are_refused_within_a_file(tmp_path):
    f = write(
        tmp_path / "only.toml",
        """
        default = "a"
        [[model]]
        name = "a"
        preset = "smollm2-135m"
        [[model]]
        name = "a"
        preset = "qwen2.5-0.5b"
    """,
    )
    with pytest.raises(EngineError) as e:
        load_catalog(f)
    assert "duplicate model name 'a'" in one_line_error(e)


def test_path_outside_allowed_roots_is_refused(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    f = write(
        tmp_path / "extra.toml",
        """
        [[model]]
        name = "sneaky"
        path = "../../../../../../etc"
    """,
    )
    with pytest.raises(EngineError) as e:
        load_catalog(extra_paths=(f,))
    msg = one_line_error(e)
    assert "outside the allowed roots" in msg and "sneaky" in msg


def test_allowed_roots_admit_an_instructor_folder(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    f = write(
        tmp_path / "extra.toml",
        """
        allowed_roots = ["models"]
        [[model]]
        name = "mine"
        path = "models/m"
        label = "Instructor's model"
    """,
    )
    cat = load_catalog(extra_paths=(f,))
    assert cat.get("mine").source == str((tmp_path / "models" / "m").resolve())
    assert cat.get("mine").trained


def test_the_app_settings_merge_extra_files(tmp_path, monkeypatch):
    f = write(
        tmp_path / "extra.toml",
        """
        [[model]]
        name = "smollm2-real"
        hub = "HuggingFaceTB/SmolLM2-135M"
    """,
    )
    use_settings(monkeypatch, catalogs=(str(f),))
    cat = load_catalog()
    assert resolve_source("smollm2-real", cat) == "HuggingFaceTB/SmolLM2-135M"


def test_the_launchers_extra_catalogs_are_checked_at_once(tmp_path):
    good = write(
        tmp_path / "good.toml",
        """
        [[model]]
        name = "smollm2-real"
        hub = "HuggingFaceTB/SmolLM2-135M"
    """,
    )
    bad = write(tmp_path / "bad.toml", "[[model]]\nname = 'x'\n")
    with pytest.raises(EngineError) as e:
        check_extra_catalogs([bad])
    assert "exactly one of path, preset, hub" in one_line_error(e)
    assert check_extra_catalogs([good]) == (str(good.resolve()),)
    assert check_extra_catalogs([good, good]) == (str(good.resolve()),)  # naming a file again is harmless


@pytest.mark.parametrize(
    "body, expected",
    [
        ('[[model]]\nname = "x"\npreset = "smollm2-135m"\ntrained = true\n', "'trained' cannot be true"),
        ('[[model]]\nname = "x"\nhub = "not a hub id"\n', "not of the form owner/name"),
        ('[[model]]\nname = "x"\npreset = "gpt-7"\n', "unknown preset 'gpt-7'"),
        ('[[model]]\nname = "x"\nhub = "a/b"\npath = "c"\n', "exactly one of path, preset, hub"),
        ('[[model]]\npath = "c"\n', "has no 'name'"),
        ('default = "nope"\n', "unknown model 'nope'"),
        ("[[model]\n", "not valid TOML"),
    ],
)
def test_malformed_entries_get_one_line(tmp_path, body, expected):
    f = write(tmp_path / "extra.toml", body)
    with pytest.raises(EngineError) as e:
        load_catalog(extra_paths=(f,))
    assert expected in one_line_error(e)


def test_missing_catalog_file(tmp_path):
    with pytest.raises(EngineError) as e:
        load_catalog(extra_paths=(tmp_path / "nope.toml",))
    assert "does not exist" in one_line_error(e)


def test_chef_facts_come_from_its_config():
    facts = describe(load_catalog().get("chef"))
    assert facts.family == "llama" and facts.trained and facts.max_context == CHEF_CONTEXT
    # The safetensors file holds exactly these fp32 parameters (plus a small JSON header).
    size = (MODELS_ROOT / "chef" / "model.safetensors").stat().st_size
    assert 0 < size - facts.weight_bytes["float32"] < 64_000
    assert facts.weight_bytes["bfloat16"] * 2 == facts.weight_bytes["float32"]


# Parameter counts published for the real models (model cards / HF configs), within 1 %.
DOCUMENTED = {"preset:smollm2-135m": 134.5e6, "preset:qwen2.5-0.5b": 494e6, "preset:llama-3.2-1b": 1.236e9}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_presets_report_documented_parameter_counts(name):
    facts = describe(load_catalog().get(name))
    assert abs(facts.n_params - DOCUMENTED[name]) / DOCUMENTED[name] < 0.01
    assert not facts.trained
    assert facts.weight_bytes["float32"] == 4 * facts.n_params


def test_smollm2_kv_bytes_per_token():
    facts = describe(load_catalog().get("preset:smollm2-135m"))
    assert facts.kv_bytes_per_token == {"float32": 46_080, "bfloat16": 23_040, "float16": 23_040, "int8": 46_080}


@pytest.mark.parametrize("name", ["chef", "apprentice"])
def test_int8_weight_bytes_are_known_before_loading(name):
    """The sidebar's figure for int8 is what the engine then holds on the device."""
    from engine import Engine

    facts = describe(load_catalog().get(name))
    assert facts.weight_bytes["int8"] == Engine.load(name, quant="int8").info.weight_bytes
    assert facts.weight_bytes["int8"] < facts.weight_bytes["float32"]  # the float embedding table stays


def test_fits_refuses_a_1b_preset_in_fp32_on_a_small_machine():
    entry = load_catalog().get("preset:llama-3.2-1b")
    fit = fits(entry, "float32", available=3 * 10**9)
    assert not fit.ok and fit.need_bytes > 4.9e9
    assert "llama-3.2-1b" in fit.message and "3.00 GB" in fit.message and "\n" not in fit.message
    assert not fits(entry, "bfloat16", available=26 * 10**8).ok  # 2.51 GB > 90 % of 2.6 GB
    assert fits(entry, "bfloat16", available=8 * 10**9).ok


def test_fits_agrees_with_the_engine_on_this_machine():
    """Measured free memory, both answers: the catalog's preview and the engine's own refusal."""
    import torch

    from engine import presets

    entry = load_catalog().get("preset:llama-3.2-1b")
    for dtype in ("float32", "bfloat16"):
        try:
            presets.check_fits("llama-3.2-1b", torch.device("cpu"), getattr(torch, dtype))
            engine_ok = True
        except EngineError:
            engine_ok = False
        assert fits(entry, dtype).ok == engine_ok


def test_fits_rejects_unknown_dtype():
    with pytest.raises(EngineError) as e:
        fits(load_catalog().get("chef"), "int3")
    assert "unsupported dtype 'int3'" in one_line_error(e)


def test_hub_entry_without_cache_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    f = write(tmp_path / "extra.toml", '[[model]]\nname = "h"\nhub = "someone/not-cached"\n')
    with pytest.raises(EngineError) as e:
        describe(load_catalog(extra_paths=(f,)).get("h"))
    assert "not in the local cache" in one_line_error(e)

"""The app's settings (serving/app_settings.py): one typed object, from the launcher's command line
and an optional TOML file to the Streamlit process's environment and back."""

from __future__ import annotations

import pytest

from engine.errors import EngineError
from kitchen_viz.launch import main
from serving.app_settings import ENV, AppSettings


def test_settings_travel_through_the_environment_and_back():
    s = AppSettings(backend="http://gpu-box:8000", backend_key="k", presenter=True, pin_server=True)
    env = s.to_env()
    assert env == {"TWO_POT_BACKEND": "http://gpu-box:8000", "TWO_POT_BACKEND_KEY": "k",
                   "TWO_POT_PRESENTER": "1", "TWO_POT_PIN_SERVER": "1"}  # fmt: skip
    assert AppSettings.from_env(env) == s
    assert AppSettings.from_env({}) == AppSettings()
    assert AppSettings.from_env({"TWO_POT_PRESENTER": "0"}).presenter is False
    assert len(set(ENV.values())) == len(ENV) and all(v.startswith("TWO_POT_") for v in ENV.values())


def test_a_settings_file_under_the_command_line(tmp_path):
    f = tmp_path / "app.toml"
    f.write_text('[app]\nclass_model = "apprentice"\nclass_key = "from-file"\npresenter = true\n')
    base = AppSettings.from_toml(f)
    assert base == AppSettings(class_model="apprentice", class_key="from-file", presenter=True)
    assert AppSettings(class_key="typed").over(base) == AppSettings(class_model="apprentice", class_key="typed",
                                                                   presenter=True)  # fmt: skip


@pytest.mark.parametrize(
    "text, words",
    [
        ("[app]\ncolour = 'red'\n", "unknown key 'colour' in [app] (known: backend, backend_key"),
        ("[app]\npresenter = 'yes'\n", "[app] presenter must be true or false"),
        ("[app]\nclass_model = 3\n", "[app] class_model must be a string"),
        ("[app\n", "settings file"),
    ],
)
def test_a_bad_settings_file_is_one_line(tmp_path, text, words):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(EngineError) as err:
        AppSettings.from_toml(f)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_launcher_reads_a_settings_file_and_refuses_a_bad_one(tmp_path, monkeypatch, capsys):
    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)
    f = tmp_path / "app.toml"
    f.write_text('[app]\nclass_model = "apprentice"\nclass_key = "s"\npresenter = true\n')
    assert main(["--settings", str(f), "--print-command"]) == 0
    got = AppSettings.from_env()
    assert (got.class_model, got.class_key, got.presenter, got.kitchens) == ("apprentice", "s", True, True)
    f.write_text("[app]\nmodel = 'x'\n")
    assert main(["--settings", str(f), "--print-command"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("two-pot-kitchen: settings file") and "unknown key 'model'" in err and "\n" not in err


def test_batch_invariant_reaches_the_float32_cpu_kitchens(tmp_path, monkeypatch):
    """`--batch-invariant` (or `batch_invariant = true` in [app]) travels to the app's process, and
    the kitchens it can hold in (float32 on CPU) start their engine in that mode."""
    from serving.http.mounted import loop_settings

    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)
    assert main(["--batch-invariant", "--print-command"]) == 0
    assert AppSettings.from_env().batch_invariant is True
    monkeypatch.delenv(ENV["pin_server"])  # loop_settings would pin this test process to one core
    assert loop_settings("chef", "cpu", "float32").engine.batch_invariant is True
    assert loop_settings("chef", "cpu", "bfloat16").engine.batch_invariant is False  # the mode is float32 only
    monkeypatch.delenv(ENV["batch_invariant"])
    assert loop_settings("chef", "cpu", "float32").engine.batch_invariant is False
    f = tmp_path / "app.toml"
    f.write_text("[app]\nbatch_invariant = true\n")
    assert AppSettings.from_toml(f).batch_invariant is True

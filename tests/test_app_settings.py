"""The app's settings (serving/app_settings.py): one typed object, from the launcher's command line
over one TOML file over the defaults, handed to the Streamlit process in a file of this user's."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from conftest import launched

from engine.errors import EngineError
from serving import app_settings
from serving.app_settings import HANDOFF_FLAG, AppSettings
from serving.caps import load_caps


def test_settings_travel_to_the_apps_process_in_a_file_of_this_users_only(tmp_path, monkeypatch):
    s = AppSettings(backend="http://gpu-box:8000", backend_key="k", presenter=True, pin_server=True,
                    catalogs=("/srv/extra.toml",), threads=3)  # fmt: skip
    path = s.write(tmp_path / "app.json")
    assert AppSettings.read(path) == s and path.stat().st_mode & 0o077 == 0  # it may hold API keys
    monkeypatch.setattr(app_settings, "_CURRENT", None)
    monkeypatch.setattr(sys, "argv", ["serve.py", HANDOFF_FLAG, str(path)])  # what Streamlit hands the script
    assert AppSettings.current() == s
    monkeypatch.setattr(app_settings, "_CURRENT", None)
    monkeypatch.setattr(sys, "argv", ["app.py"])  # plain `streamlit run app.py`: the defaults
    assert AppSettings.current() == AppSettings()


def test_a_settings_file_under_the_command_line(tmp_path):
    f = tmp_path / "app.toml"
    f.write_text('[app]\nclass_model = "apprentice"\nclass_key = "from-file"\npresenter = true\nthreads = 2\n')
    base = AppSettings.from_toml(f)
    assert base == AppSettings(class_model="apprentice", class_key="from-file", presenter=True, threads=2)
    assert AppSettings(class_key="typed").over(base) == AppSettings(class_model="apprentice", class_key="typed",
                                                                   presenter=True, threads=2)  # fmt: skip
    assert AppSettings(pin=False).over(base).pin is False and AppSettings().over(base).pin is True
    one = tmp_path / "one.toml"  # one file for everything: the settings, the caps, extra models
    one.write_text('[app]\npresenter = true\n[caps]\nmax_new_tokens = 64\n[[model]]\nname = "x"\nhub = "a/b"\n')
    s = AppSettings.from_toml(one)
    assert s.caps == str(one.resolve()) and s.catalogs == (str(one.resolve()),) and s.presenter
    assert load_caps(s.caps).max_new_tokens == 64


@pytest.mark.parametrize(
    "text, words",
    [
        ("[app]\ncolour = 'red'\n", "unknown key 'colour' in [app] (known: backend, backend_key"),
        ("[app]\npresenter = 'yes'\n", "[app] presenter must be true or false"),
        ("[app]\nclass_model = 3\n", "[app] class_model must be a string"),
        ("[app]\nthreads = -1\n", "[app] threads must be a whole number >= 0"),
        ("[app\n", "settings file"),
    ],
)
def test_a_bad_settings_file_is_one_line(tmp_path, text, words):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(EngineError) as err:
        AppSettings.from_toml(f)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_launcher_reads_a_settings_file_and_refuses_a_bad_one(tmp_path, capsys):
    f = tmp_path / "app.toml"
    f.write_text('[app]\nclass_model = "apprentice"\nclass_key = "s"\npresenter = true\n')
    got = launched(["--settings", str(f)], capsys)[1]
    assert (got.class_model, got.class_key, got.presenter, got.kitchens) == ("apprentice", "s", True, True)
    assert got.pin and got.pin_server and launched(["--no-pin", "--threads", "1"], capsys)[1].pin is False
    f.write_text("[app]\nmodel = 'x'\n")
    code, _, err = launched(["--settings", str(f)], capsys)
    err = err.strip()
    assert code == 2 and err.startswith("two-pot-kitchen: settings file") and "unknown key 'model'" in err
    assert "\n" not in err


def test_batch_invariant_reaches_the_float32_cpu_kitchens(tmp_path, monkeypatch, capsys):
    """`--batch-invariant` (or `batch_invariant = true` in [app]) travels to the app's process, and
    the kitchens it can hold in (float32 on CPU) start their engine in that mode."""
    from serving.http.mounted import loop_settings

    s = launched(["--batch-invariant"], capsys)[1]
    assert s.batch_invariant is True
    monkeypatch.setattr(app_settings, "_CURRENT", replace(s, pin_server=False))  # loop_settings would pin this process
    assert loop_settings("chef", "cpu", "float32").engine.batch_invariant is True
    assert loop_settings("chef", "cpu", "bfloat16").engine.batch_invariant is False  # the mode is float32 only
    monkeypatch.setattr(app_settings, "_CURRENT", AppSettings())
    assert loop_settings("chef", "cpu", "float32").engine.batch_invariant is False
    f = tmp_path / "app.toml"
    f.write_text("[app]\nbatch_invariant = true\n")
    assert AppSettings.from_toml(f).batch_invariant is True

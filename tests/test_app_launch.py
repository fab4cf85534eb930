"""The `two-pot-kitchen` launcher: the streamlit command it builds and its one-line refusals."""

from __future__ import annotations

from conftest import launched

from kitchen_viz.launch import SERVE, main, streamlit_command
from serving.app_settings import HANDOFF_FLAG


def test_the_command_runs_our_app_with_defaults_the_caller_can_override():
    cmd = streamlit_command(["--server.port", "8600"])
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4] == str(SERVE)
    assert cmd[-2:] == ["--server.port", "8600"] and "--server.headless" in cmd
    mine = streamlit_command(["--server.headless=false"])
    assert mine.count("--server.headless") == 0 and "--server.headless=false" in mine


def test_print_command_passes_unknown_options_to_streamlit(capsys):
    assert main(["--print-command", "--server.address", "0.0.0.0"]) == 0
    out = capsys.readouterr().out
    assert "streamlit run" in out and "--server.address 0.0.0.0 -- " + HANDOFF_FLAG in out  # the app's settings last


def test_a_bad_extra_catalog_is_one_line_and_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[model]]\nname = "x"\ncolour = "red"\n')
    assert main(["--catalog", str(bad), "--print-command"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("two-pot-kitchen: ") and "\n" not in err


def test_an_extra_catalog_is_handed_to_the_app_in_its_settings(tmp_path, capsys):
    extra = tmp_path / "extra.toml"
    extra.write_text('[[model]]\nname = "class-hub"\nhub = "someone/some-model"\nlabel = "Class model"\n')
    assert launched(["--catalog", str(extra)], capsys)[1].catalogs == (str(extra.resolve()),)


def test_a_caps_file_is_checked_then_handed_to_the_app_in_its_settings(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[caps]\nmax_seconds = 5\n")
    code, _, err = launched(["--caps", str(bad)], capsys)
    err = err.strip()
    assert code == 2 and err.startswith("two-pot-kitchen: ") and "unknown cap 'max_seconds'" in err and "\n" not in err
    good = tmp_path / "caps.toml"
    good.write_text("[caps]\nmax_order_seconds = 30\n")
    assert launched(["--caps", str(good)], capsys)[1].caps == str(good.resolve())

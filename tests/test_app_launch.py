"""The `two-pot-kitchen` launcher: the streamlit command it builds and its one-line refusals."""

from __future__ import annotations

from kitchen_viz.launch import SERVE, main, streamlit_command


def test_the_command_runs_our_app_with_defaults_the_caller_can_override():
    cmd = streamlit_command(["--server.port", "8600"])
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4] == str(SERVE)
    assert cmd[-2:] == ["--server.port", "8600"] and "--server.headless" in cmd
    mine = streamlit_command(["--server.headless=false"])
    assert mine.count("--server.headless") == 0 and "--server.headless=false" in mine


def test_print_command_passes_unknown_options_to_streamlit(capsys):
    assert main(["--print-command", "--server.address", "0.0.0.0"]) == 0
    out = capsys.readouterr().out
    assert "streamlit run" in out and out.strip().endswith("--server.address 0.0.0.0")


def test_a_bad_extra_catalog_is_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TWO_POT_CATALOG", raising=False)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[model]]\nname = "x"\ncolour = "red"\n')
    assert main(["--catalog", str(bad), "--print-command"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("two-pot-kitchen: ") and "\n" not in err


def test_an_extra_catalog_is_handed_to_the_app_through_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TWO_POT_CATALOG", raising=False)
    extra = tmp_path / "extra.toml"
    extra.write_text('[[model]]\nname = "class-hub"\nhub = "someone/some-model"\nlabel = "Class model"\n')
    assert main(["--catalog", str(extra), "--print-command"]) == 0
    import os

    assert str(extra.resolve()) in os.environ["TWO_POT_CATALOG"]


def test_a_caps_file_is_checked_then_handed_to_the_app_through_the_environment(tmp_path, monkeypatch, capsys):
    import os

    monkeypatch.delenv("TWO_POT_CAPS", raising=False)
    bad = tmp_path / "bad.toml"
    bad.write_text("[caps]\nmax_seconds = 5\n")
    assert main(["--caps", str(bad), "--print-command"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("two-pot-kitchen: ") and "unknown cap 'max_seconds'" in err and "\n" not in err
    assert "TWO_POT_CAPS" not in os.environ
    good = tmp_path / "caps.toml"
    good.write_text("[caps]\nmax_order_seconds = 30\n")
    assert main(["--caps", str(good), "--print-command"]) == 0
    assert os.environ["TWO_POT_CAPS"] == str(good.resolve())

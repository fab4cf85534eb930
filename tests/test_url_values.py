"""A link's values are read in one place (kitchen_viz/url_values.py): NaN, infinities, words, a
fraction where a whole number goes and an unclear yes/no are each ignored with one line naming the
value and what the link may say; a usable number outside its range is moved inside by the order
form with one line naming the limit."""

from __future__ import annotations

import pytest
from app_kit import APP, open_kitchen
from streamlit.testing.v1 import AppTest

from kitchen_viz.url_values import KINDS, flag, read


@pytest.mark.parametrize(
    ("name", "raw", "why"),
    [
        ("temp", "nan", "not a finite number (temp takes a number from 0 to 2)"),
        ("temp", "NaN", "not a finite number"),
        ("temp", "inf", "not a finite number"),
        ("temp", "-inf", "not a finite number"),
        ("temp", "warm", "not a number (temp takes a number from 0 to 2)"),
        ("batch", "nan", "not a finite number (batch takes a whole number of at least 1)"),
        ("batch", "2.5", "not a whole number"),
        ("prompt", "1e999", "not a finite number"),
        ("new", "", "not a number"),
        ("live", "maybe", "not on or off (live takes 1 or 0)"),
    ],
)
def test_a_value_that_cannot_be_used_is_ignored_with_one_line(name, raw, why):
    got = read(name, raw)
    assert got.value is None and got.problem is not None
    assert got.problem.startswith(f"Ignored ?{name}={raw}: {why}") and "\n" not in got.problem


def test_usable_values_keep_their_kind():
    assert read("batch", "4").value == 4 and isinstance(read("batch", "4").value, int)
    assert read("batch", "4.0").value == 4 and read("prompt", " 32 ").value == 32
    assert read("temp", "0.7").value == 0.7 and read("temp", "5").value == 5.0  # moved inside by the form
    assert read("batch", "-3").value == -3  # also moved inside by the form, with the limit named
    assert read("live", "0").value is False and read("reuse", "yes").value is True
    assert flag("presenter", "1") is True and flag("presenter", "no", True) is False
    assert flag("presenter", "sure", True) is True and flag("presenter", None) is False
    assert set(KINDS) >= {"prompt", "batch", "new", "temp", "live", "reuse", "presenter"}


def test_the_kitchen_ignores_nan_and_moves_a_number_inside_with_the_limit():
    at = open_kitchen(temp="nan", batch="inf", new="0")
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert "Ignored ?temp=nan: not a finite number (temp takes a number from 0 to 2)." in warnings
    assert "Ignored ?batch=inf: not a finite number (batch takes a whole number of at least 1)." in warnings
    assert any(w.startswith("?new=0 raised to 1:") for w in warnings)
    assert not any("nan" in w and "Ignored" not in w for w in warnings), warnings
    assert at.slider(key="tpk_temp").value == 0.0 and at.slider(key="tpk_batch").value == 1
    assert not at.button(key="tpk-cook").disabled
    at = open_kitchen(temp="5")
    assert any(w.value.startswith("?temp=5 lowered to 2: 2 is the highest offered") for w in at.warning)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["presenter"] = "maybe"
    at.run()  # the sidebar reads ?model= and ?presenter= on the session's first run
    assert not at.exception
    assert "Ignored ?presenter=maybe: not on or off (presenter takes 1 or 0)." in [w.value for w in at.sidebar.warning]

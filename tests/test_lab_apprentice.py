"""The apprentice chef's compute function, headless on the real chef (and a model it cannot serve)."""

from __future__ import annotations

import pytest
from conftest import travels

from engine import Engine, EngineError
from lab.apprentice import ApprenticeSettings, predicted_speedup, run_apprentice, tokens_per_pass


def test_the_apprentice_chef_measures_both_drafts_on_the_chef():
    eng = Engine.load("chef")
    seen = []
    res = run_apprentice(eng, ApprenticeSettings(k=3, new_tokens=16, batches=(1, 4), repeats=1), seen.append)
    travels(res)
    assert [p.done for p in seen] == [1, 2, 3, 4]
    keys = {(r.order, r.draft, r.batch) for r in res.rows}
    assert keys == {(o, d, b) for o, b in [("copy", 1), ("fresh", 1), ("fresh, T=0.8", 1), ("copy", 4)]
                    for d in ("ngram", "apprentice")}  # fmt: skip
    for r in res.rows:
        assert r.identical is (True if "T=" not in r.order else None)  # greedy: the plain text, token for token
        assert r.plain_tps > 0 and r.spec_tps > 0  # the speedup is the median of the repeats' own ratios:
        spread = r.speedup_spread  # at least 3 repeats, whatever the settings ask, with their range kept
        assert spread.n >= 3 and spread.low <= r.speedup == spread.median <= spread.high
        assert r.drafts > 0 and 0 <= r.accepted <= r.drafted <= 3 * r.drafts
        assert r.mean_acceptance_length == pytest.approx(1 + r.accepted / r.drafts)
        assert list(r.accepted_at) == sorted(r.accepted_at, reverse=True) and len(r.accepted_at) == 3
        assert r.predicted_speedup == pytest.approx(predicted_speedup(r.acceptance_rate, 3, r.cost_ratio))
        assert (r.cost_ratio > 0) == (r.draft == "apprentice") and r.verify_ratio > 0
        assert 0 < r.passes_per_token <= 1
    assert res.row("copy", "ngram").accepted > 0  # the copy order is what prompt lookup is for
    frame = res.to_frame()
    assert len(frame) == len(res.rows) and len(res.positions_frame()) == 3 * len(res.rows)


def test_leviathan_formula_at_its_limits():
    assert tokens_per_pass(0.0, 4) == 1 and tokens_per_pass(1.0, 4) == 5
    assert tokens_per_pass(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert predicted_speedup(1.0, 4, 0.25) == pytest.approx(5 / 2)


def test_a_model_the_apprentice_cannot_serve_gets_prompt_lookup_only(tiny_llama):
    res = run_apprentice(Engine.load(str(tiny_llama.path)), ApprenticeSettings(k=2, new_tokens=8, batches=(1,), repeats=1))
    assert {r.draft for r in res.rows} == {"ngram"}
    assert any("vocabulary of 2,048 ids" in n for n in res.notes)


@pytest.mark.parametrize("bad, limit", [({"k": 0}, "k must be 1..16"), ({"new_tokens": 2}, "at least 8"),
                                        ({"batches": (0,)}, "1..64"), ({"drafts": ("eagle",)}, "drafts must be")])  # fmt: skip
def test_bad_settings_are_refused_in_one_line(tiny_llama, bad, limit):
    with pytest.raises(EngineError, match=limit):
        run_apprentice(Engine.load(str(tiny_llama.path)), ApprenticeSettings(**bad))


def _spec(draft, order, batch, speedup, alpha=0.6, c=0.3, mal=2.0):
    from lab.serving_verdicts import SpecNumbers

    return SpecNumbers(draft, order, batch, 4, speedup, alpha, mal, c, predicted_speedup(alpha, 4, c))


def test_the_inspector_names_the_draft_that_paid_and_why_the_apprentice_did_not():
    from lab.serving_verdicts import diagnose_speculation

    v = diagnose_speculation([_spec("ngram", "copy", 1, 2.8, alpha=0.9, c=0.0, mal=4.1),
                              _spec("apprentice", "fresh", 1, 0.9, alpha=0.4, c=0.3, mal=1.5),
                              _spec("apprentice", "fresh, T=0.8", 1, 0.6, alpha=0.2),
                              _spec("ngram", "copy", 8, 0.7)])  # fmt: skip
    assert "ngram on the copy order: x2.80" in v.headline
    assert any("one chef step plus 4 guesses at 0.30 of a step each = 2.20 chef steps" in f for f in v.fixes)
    assert any("20% here" in f for f in v.fixes) and any("batch 8" in f for f in v.fixes)
    assert not any(word in f for f in [v.headline, *v.fixes] for word in ("alpha", "k x c", "max_seqs"))
    assert len(v.evidence) == 4


def test_the_inspector_says_so_when_no_draft_paid():
    from lab.serving_verdicts import diagnose_speculation

    v = diagnose_speculation([_spec("ngram", "fresh", 1, 1.01), _spec("apprentice", "fresh", 1, 0.8)])
    assert v.headline.startswith("No draft paid off") and not any("batch" in f for f in v.fixes)


def test_the_page_runs_through_the_kitchen_and_shows_charts_tables_and_verdict(tmp_path, monkeypatch):
    """The page with its defaults on the chef, through the app's engine process."""
    from app_kit import lab_page_test

    monkeypatch.setenv("TWO_POT_LAB_CACHE", str(tmp_path / "lab-cache"))
    at = lab_page_test("apprentice")
    at.run()
    at.number_input(key="apprentice-guess").set_value(1.5).run()
    next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 3 and len(at.dataframe) == 2
    assert set(at.dataframe[0].value["draft"]) == {"ngram", "apprentice"}
    assert "draft" in at.info[0].value
    assert any(m.value.startswith("#### 4. The inspector's verdict (on the run: k = 4") for m in at.markdown)


def _row(draft, batch, speedup):
    from lab.apprentice import SpecRow

    return SpecRow("copy", draft, batch, 100.0, 100.0 * speedup, speedup, True, 4, 16, 8, 0.5, 3.0, 0.6, 0.0, 1.0,
                   1.5, (0.5, 0.5, 0.5))  # fmt: skip


def test_close_speedups_at_one_batch_label_one_above_and_one_below():
    from lab.apprentice import ApprenticeResult, batch_figure

    rows = [_row("ngram", 1, 2.9), _row("apprentice", 1, 2.8), _row("ngram", 8, 0.58), _row("apprentice", 8, 0.53)]
    fig = batch_figure(ApprenticeResult(ApprenticeSettings(), "chef", "cpu", rows))
    sides = {t.name: list(t.textposition) for t in fig.data if t.text is not None}
    # at each batch the higher labels above, the lower below, even near the axis (x0.53 under x0.58)
    assert sides == {"ngram": ["top center", "top center"], "apprentice": ["bottom center", "bottom center"]}
    # the room under zero holds a label row, and no tick is drawn there
    low, high = fig.layout.yaxis.range
    assert low == pytest.approx(-0.1 * high) and high == pytest.approx(2.9 * 1.3)
    assert fig.layout.yaxis.tick0 == 0 and fig.layout.yaxis.dtick > -low
    assert list(fig.layout.xaxis.tickvals) == [1, 8]  # each measured batch is named under its points

"""The shared shape of every experiment page: the Streamlit side of the lab (lab/ itself has no UI).

Every lab page tells the same five-beat lesson, so it is written once here:
  1. framing: what the experiment is, in kitchen words and in engineering words;
  2. predict first: the learner answers a numeric question *before* any result is shown
     (results, even cached ones, stay hidden until they answer), and the guess is drawn on the
     chart next to the measurement;
  3. run: the work goes to the session's kitchen (`svc.submit(LabRun(...))`: its kitchen host runs
     it in the engine's own process, between orders), so the engine is never touched from the
     page thread; a progress bar with an ETA follows the job's events;
  4. results: plotly charts (each with a PNG download), the table with a CSV download, and the
     experiment's findings in words;
  5. the inspector's verdict on one real run of the sweep.

Results are cached on disk per (experiment, model, device, dtype, settings) as they arrive, so a
measurement survives the learner closing the tab mid-run, and the next visitor sees it at once.

What it renders is a `lab.experiment.Experiment` (framing, form, compute, figures, verdict, all in
the experiment's own module in lab/). The app builds one page per registered experiment
(`lab_page`), so an experiment is one module and one registry line, with no page file of its own.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import datetime, timezone
from functools import partial

import streamlit as st

from kitchen_viz.app_state import APP_DIR, current_settings, safe_model_choices, service_for
from kitchen_viz.fetch_progress import fetch_state
from kitchen_viz.icons import nav_icon
from kitchen_viz.model_pick import model_line
from lab.cache import (
    CachedResult,
    ResultCache,
    cache_key,
    latest_roof,
    model_fingerprint,
    remember_roof,
)
from lab.experiment import Experiment, Prediction  # noqa: F401  (re-exported for pages and tests)
from lab.export import figure_png, slug
from lab.inflight import InFlight
from lab.plot_kit import readable
from lab.progress import Progress
from lab.registry import EXPERIMENTS, LabRun, experiment

ENGINEERS = "Engineer's details"  # where the terms of art live: a teacher's main text is the kitchen's


def framing(exp: Experiment) -> None:
    st.title(f"{exp.icon} {exp.title}")  # a Material icon: drawn by Streamlit's own font
    st.markdown("**In the kitchen**")
    st.markdown(exp.kitchen)
    with st.expander(f"{ENGINEERS}: in the engine", icon=":material/engineering:"):
        st.markdown(exp.engineering)


def ready_service(settings):
    """This session's kitchen, waiting (with a message) while it loads: the app's own engine process,
    or a kitchen server (the app's own under `two-pot-kitchen`, or `--backend`), which runs the sweep
    in an engine process of its own (lab/sweeps.py) and streams its progress back."""
    svc = service_for(settings)
    if svc.state == "loading":
        with st.spinner(svc.loading_message):
            svc.wait_ready(timeout=300)
    if svc.state == "error":
        st.error(svc.load_error or "the model could not be loaded")
        return None
    return svc


def ask_prediction(exp: Experiment) -> float | None:
    p = exp.predict
    st.markdown("#### 1. Predict first")
    guess = st.number_input(
        f"{p.question} ({p.unit})",
        min_value=p.min_value,
        max_value=p.max_value,
        step=p.step,
        value=None,
        key=f"{exp.key}-guess",
        placeholder="your guess",
    )
    if guess is None:
        st.caption("Answer first: the run button and any stored results appear once you have guessed.")
    return guess


@st.cache_resource(show_spinner=False)
def inflight() -> InFlight:
    """The server's register of lab runs in progress (one per cache key)."""
    return InFlight()


def follow_job(job) -> None:
    """Block this page's script (not the kitchen) until the job ends, drawing progress and ETA."""
    bar = st.progress(0.0, text="sending the order to the kitchen")
    while not job.finished:
        if job.status in ("queued", "loading"):
            bar.progress(0.0, text=f"waiting for the kitchen: place {job.place_in_line()} in line")
        else:
            last = next((e for e in reversed(job.events) if isinstance(e, Progress)), None)
            if last is not None:
                bar.progress(min(1.0, last.fraction), text=last.line())
            else:
                bar.progress(0.0, text="warming up the stove")
        time.sleep(0.2)
    bar.empty()


def run_experiment(exp: Experiment, svc, settings, cache: ResultCache, key: str) -> CachedResult | None:
    def keep(result) -> CachedResult:
        if getattr(result, "roof", None) is not None:
            remember_roof(result.roof, cache)  # other pages' inspectors can now use it
        return cache.put(key, result)

    work = LabRun(exp.key, settings, keep)
    job, joined = inflight().join_or_submit(key, lambda: svc.submit(work, label=f"lab: {exp.title}"))
    if joined:
        st.caption("Another visitor started this same measurement; following their run.")
    follow_job(job)
    if job.status == "error":
        st.error(job.error)
        return None
    return job.result


def show_figures(exp: Experiment, result, guess: float | None, presenter: bool = False) -> None:
    for i, fig in enumerate(exp.figures(result, guess)):
        readable(fig, presenter)  # plotly draws its text in px: presenter mode's root font cannot reach it
        st.plotly_chart(fig, key=f"{exp.key}-fig-{i}")
        title = fig.layout.title.text or f"{exp.key}-{i}"
        st.download_button(
            "Download PNG",
            data=lambda fig=fig: figure_png(fig),
            file_name=f"{slug(title)}.png",
            mime="image/png",
            key=f"{exp.key}-png-{i}",
            on_click="ignore",
        )


def show_tables(exp: Experiment, result) -> None:
    with st.expander(f"{ENGINEERS}: every measured number", icon=":material/table:"):
        show_table_rows(exp, result)


def show_table_rows(exp: Experiment, result) -> None:
    for name, frame in exp.tables(result).items():
        st.dataframe(frame, hide_index=True)
        st.download_button(
            f"Download {name} (CSV)",
            data=frame.to_csv(index=False),
            file_name=f"{exp.key}-{name}.csv",
            mime="text/csv",
            key=f"{exp.key}-csv-{name}",
            on_click="ignore",
        )


def show_verdict(exp: Experiment, result, settings, cache: ResultCache) -> None:
    roof = getattr(result, "roof", None) or latest_roof(settings.device, settings.dtype, cache)
    verdict = exp.verdict(result, roof, settings.dtype)
    st.markdown(f"#### 4. The inspector's verdict (on the run: {exp.verdict_on(result)})")
    if roof is None:
        st.caption(
            "Run the Roofline experiment once on this device to let the inspector tell bandwidth "
            "from compute."
        )
    st.info(verdict.headline)
    for fix in verdict.fixes:
        st.markdown(f"- {fix}")
    with st.expander("Evidence the inspector used"):
        for line in verdict.evidence:
            st.markdown(f"- {line}")


def show_machine(machine) -> None:
    """Whether other work used the engine's cores while this result was measured (lab.noise)."""
    if machine is None:
        return
    if machine.busy:
        st.warning(machine.summary() + " Its numbers may be slower and noisier than this machine can do.",
                   icon=":material/warning:")
    else:
        st.caption(machine.summary())


def show_results(
    exp: Experiment, saved: CachedResult, guess: float | None, settings, cache: ResultCache
) -> None:
    result = saved.result
    when = datetime.fromtimestamp(saved.saved_at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    st.markdown("#### 3. What we measured")
    st.caption(f"Measured on {settings.device} ({settings.dtype}) with {settings.model} at {when}.")
    show_machine(getattr(result, "machine", None))
    measured = exp.predict.answer(result)
    if guess is not None:
        st.markdown(
            f"You guessed **{guess:g}{exp.predict.unit}**; "
            f"this machine measured **{measured:.3g}{exp.predict.unit}**."
        )
    for note in getattr(result, "notes", []):
        st.markdown(f"- {note}")
    show_figures(exp, result, guess, settings.presenter)
    show_tables(exp, result)
    show_verdict(exp, result, settings, cache)


def lab_page(exp: Experiment) -> st.Page:
    """The navigation's page for one experiment, at `/lab_<key>`. A page link needs the same object
    shape (Streamlit matches pages by their url path), so every link is built here too."""
    return st.Page(partial(render_experiment, exp), title=exp.nav_title, icon=nav_icon(exp.icon),
                   url_path=exp.url_path)  # fmt: skip


def page_target(link: str) -> str | st.Page | None:
    """What `st.page_link` takes for a link: a page file as it is, a lab page's address
    (`lab_padding`) as its page; None when neither exists in this build."""
    if link.startswith("lab_"):
        key = link.removeprefix("lab_")
        return lab_page(experiment(key)) if any(e.key == key for e in EXPERIMENTS) else None
    return link if (APP_DIR / link).is_file() else None


def render_experiment(exp: Experiment) -> None:
    """The whole page: framing, the model it is for, settings, prediction, run (or cached result),
    charts, verdict."""
    framing(exp)
    app = current_settings()
    st.caption(f":material/info: {model_line(exp.model, app.model, [c.name for c in safe_model_choices()[0]])}")
    if fetch_state(app.model) is not None:  # fetched on first use and not ready yet: nothing to measure on
        st.info(f"This model ({app.model}) is being fetched for its first use; the sidebar shows how far along it "
                "is. This page opens by itself when it is ready.", icon=":material/downloading:")  # fmt: skip
        return
    svc = ready_service(app)
    if svc is None:
        return
    with st.expander("Experiment settings", expanded=False):
        settings = exp.form(st, svc.info)  # lab/ has no UI: the form draws with the st we pass
        st.caption(f"Settings: {asdict(settings)}")
    cache = ResultCache()
    key = cache_key(exp.key, model_fingerprint(app.model), app.device, app.dtype, settings)
    guess = ask_prediction(exp)
    saved = cache.get(key)
    st.markdown("#### 2. Run it on this machine")
    if guess is None:
        return
    running = inflight().running(key)
    if st.button("Re-run" if saved else "Run", type="primary", key=f"{exp.key}-run"):
        saved = run_experiment(exp, svc, settings, cache, key) or saved
    elif running is not None:
        st.caption("This measurement is running for another visitor; following it.")
        follow_job(running)
        saved = running.result if running.status == "done" else saved
    elif saved:
        st.caption("A stored measurement for these settings is shown below; Re-run measures afresh.")
    if saved:
        show_results(exp, saved, guess, app, cache)

"""The monitoring dashboard: every order this server has cooked, as a service operator sees them.

Separate TTFT and TPS panels on purpose (the seed's advice): a climbing TTFT says the wok (prefill
or the queue in front of it) is struggling; falling tokens/s says the soup pot is. One blended
"latency" number would hide which fix to reach for. Data: `lab.runlog.RunLog` (the kitchen records
each finished Cook), percentiles from `lab.monitoring`.

Percentiles are taken over one kind of kitchen at a time: a filter by model, device and precision
(all of them by default only when the log holds one kind), because a p50 over the chef and a 1B
preset, or float32 and bfloat16, describes no kitchen at all.
"""

import streamlit as st

from kitchen_viz.app_state import current_settings, run_log
from kitchen_viz.charts import kv_memory_figure, percentile_figure, rate_figure
from lab.monitoring import requests_per_minute, summary, with_percentiles
from lab.units import reused_words

WINDOWS = {"1 minute": "1min", "5 minutes": "5min", "15 minutes": "15min", "1 hour": "60min"}
FILTERS = (("model", "Model"), ("device", "Device"), ("dtype", "Precision"))


def kitchens_filter(frame):
    """The rows of the kitchens picked in the three filters (each defaults to the newest run's kind),
    and a one-line description of what is shown."""
    cols = st.columns(len(FILTERS))
    shown, words = frame, []
    for col, (column, label) in zip(cols, FILTERS, strict=True):
        kinds = sorted(str(v) for v in frame[column].dropna().unique() if str(v))
        if not kinds:
            continue
        newest = str(frame[column].iloc[-1]) if str(frame[column].iloc[-1]) in kinds else kinds[0]
        picked = col.multiselect(label, kinds, default=[newest], key=f"dash-filter-{column}")
        shown = shown[shown[column].astype(str).isin(picked)]
        words.append(f"{label.lower()} {', '.join(picked) or 'none'}")
    return shown, "; ".join(words)


st.title(":material/monitoring: The dashboard: every order this server cooked")
st.markdown(
    "The kitchen page shows one order; an operator watches all of them. Each dot is one finished Cook from "
    "any browser on this server; the lines are percentiles over a trailing window. **TTFT** (the wok, "
    "plus any "
    "queue) and **tokens/s** (the soup pot) get separate panels because they break for different reasons."
)


def metric_row(frame) -> None:
    s = summary(frame)
    row = st.columns(4) + st.columns(4)
    slowest = "the slow tail: {} of the runs took at least this long"
    row[0].metric("Runs", s["runs"])
    row[1].metric("TTFT p50", f"{s['ttft_p50_ms']:.0f} ms", help="the median: half the runs were faster")
    row[2].metric("TTFT p99", f"{s['ttft_p99_ms']:.0f} ms", help=slowest.format("the slowest 1 %"))
    row[3].metric("TPOT p50", f"{s['tpot_p50_ms']:.1f} ms", help="the median time per output token")
    row[4].metric("Decode tok/s p50", f"{s['decode_tps_p50']:.0f}", help="the median tokens per second")
    row[5].metric("E2E p50", f"{s['e2e_p50_ms']:.0f} ms", help="the median end-to-end time")
    row[6].metric("Queue wait p90", f"{s['queue_wait_p90_ms']:.0f} ms", help=slowest.format("the slowest 10 %"))
    row[7].metric("KV cache max", f"{s['kv_mb_max']:.2f} MB")
    reused, prompt = int(frame["reused_tokens"].fillna(0).sum()), int(frame["prompt_tokens"].sum())
    if reused:
        runs = int((frame["reused_tokens"].fillna(0) > 0).sum())
        st.caption(
            f":material/recycling: {runs} of these runs started from leftovers: {reused_words(reused, prompt)}. "
            "Their prefill rate counts only the tokens the wok cooked."
        )


def panels(frame, window: str, presenter: bool) -> None:
    """One chart per row: at 1024 px two side by side left each too narrow for legible type."""
    stats = with_percentiles(frame, ["ttft_s", "decode_tps", "e2e_s", "queue_wait_s"], window, rates=("decode_tps",))
    st.caption(
        f"Percentiles over the last {window} before each run; the latest window held "
        f"{int(stats.window_runs.iloc[-1])} run(s) (with few runs, the slow tail is simply the slowest run)."
    )
    charts = {
        "dash-ttft": percentile_figure(stats, "ttft_s", "TTFT: the wok, and its slow tail", 1e3, "ms",
                                       presenter=presenter),
        "dash-tps": percentile_figure(stats, "decode_tps", "Decode tokens/s: the soup pot, and its slow tail",
                                      1.0, "tokens / s", rate=True, presenter=presenter),
        "dash-e2e": percentile_figure(stats, "e2e_s", "End-to-end time per order", 1e3, "ms", presenter=presenter),
        "dash-queue": percentile_figure(stats, "queue_wait_s", "Queue wait before cooking", 1e3, "ms",
                                        presenter=presenter),
        "dash-kv": kv_memory_figure(stats, presenter),
        "dash-rpm": rate_figure(requests_per_minute(frame), presenter=presenter),
    }  # fmt: skip
    for key, fig in charts.items():
        st.plotly_chart(fig, key=key, config={"displayModeBar": False})


@st.fragment(run_every="5s")
def live_view(window: str) -> None:
    frame = run_log().frame()
    if frame.empty:
        st.info("No orders cooked yet in this server session. Cook one in the Kitchen and it appears here.")
        return
    frame, words = kitchens_filter(frame)
    if frame.empty:
        st.info("No runs for this choice of model, device and precision.")
        return
    st.caption(f"Showing {len(frame)} run(s): {words}.")
    class_set = frame[frame["cause"].astype(str).str.startswith("the class")]
    if len(class_set):
        st.warning(f"{len(class_set)} of these {len(frame)} orders shared most of their decode steps with other "
                   "orders: the class, not the order, set their TPOT (the table's `cause` column says how many "
                   "steps each shared).", icon=":material/groups:")  # fmt: skip
    metric_row(frame)
    panels(frame, window, current_settings().presenter)
    st.dataframe(frame, hide_index=True)
    st.download_button(
        "Download all runs (CSV)",
        data=frame.to_csv(index=False),
        file_name="runs.csv",
        mime="text/csv",
        key="dash-csv",
        on_click="ignore",
    )


window = WINDOWS[st.selectbox("Percentile window", list(WINDOWS), index=1, key="dash-window")]
live_view(window)

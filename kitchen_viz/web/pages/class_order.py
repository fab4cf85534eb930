"""Order from a class kitchen: any OpenAI-compatible server, measured from this browser's side.

For a student in a class whose kitchen is `two-pot-kitchen serve` on the teacher's machine, or for
anyone pointing the app at a vLLM or llama.cpp server (`two-pot-kitchen --backend URL`). Your order
shares the pot with everyone else's; the page shows what you can measure from outside (TTFT, the
gaps between chunks, tokens/s, usage) and, from a Two-Pot server, the kitchen's own measurement of
each step that cooked your tokens, including how many orders were in the pot with yours.
Logic: serving/clients/remote_order.py.
"""

from __future__ import annotations

import statistics
import time

import pandas as pd
import streamlit as st

from engine.errors import EngineError
from kitchen_viz.app_state import class_kitchen_address
from kitchen_viz.class_rail import rail_html
from kitchen_viz.whole_class import draw_whole_class
from serving.clients.remote_order import board, models, order_remote
from serving.clients.token_confidence import confidence_html, summarize

RAIL_EVERY_S = 0.5  # how often the rail is refreshed while your order streams

st.title("🧾 Order from a class kitchen")
st.caption(
    "Every number below is measured: at the client (this app, from the stream) unless it says "
    "the kitchen measured it. A remote kitchen cannot show its wok and pot the way the Kitchen page "
    "does: only what its stream carries."
)
address, known_key = class_kitchen_address()
url = st.text_input("Kitchen server", value=address, key="order-url")
api_key = st.text_input("API key", value=known_key, type="password", key="order-key") or None
try:
    offered = models(url, api_key)
except EngineError as err:
    st.error(f"{err}. Start one with `two-pot-kitchen serve`, or check the address and key.")
    st.stop()
model = st.selectbox("Model", offered, key="order-model")
prompt = st.text_area("Your order (prompt)", value="ROMEO:", key="order-prompt")
cols = st.columns(2)
max_tokens = cols[0].number_input("New tokens", min_value=1, max_value=4096, value=32, key="order-new")
temperature = cols[1].number_input("Temperature", min_value=0.0, max_value=2.0, value=0.0, step=0.1, key="order-temp")
sure = st.checkbox("Show how sure the chef was of each token (the server's logprobs)", value=True, key="order-sure")


def ms(v) -> str:
    return "—" if v is None else f"{v * 1e3:,.1f} ms"


if st.button("🔥 Order", type="primary", key="order-go"):
    if not prompt.strip():
        st.error("The order is empty: write a prompt (at least one non-space character).")
        st.stop()
    live = st.empty()
    before = board(url, since=2**62, api_key=api_key)  # a Two-Pot class kitchen keeps a board; others do not
    if before is not None:
        st.caption("The rail: every order in the class kitchen right now (yours highlighted, the others anonymous).")
        rail = st.empty()
        rail.markdown(rail_html(before), unsafe_allow_html=True)
        seen = {"at": time.perf_counter(), "step": before["last_step"]}

    def on_chunk(o) -> None:
        live.markdown(f"```\n{prompt}{o.text}\n```")
        if before is not None and time.perf_counter() - seen["at"] >= RAIL_EVERY_S:
            now = board(url, o.order_id, since=seen["step"], api_key=api_key)
            seen["at"] = time.perf_counter()
            if now is not None:
                seen["step"] = now["last_step"]
                rail.markdown(rail_html(now), unsafe_allow_html=True)

    try:
        out = order_remote(url, model, prompt, int(max_tokens), float(temperature), api_key, on_chunk=on_chunk,
                           logprobs=1 if sure else None)  # fmt: skip
    except EngineError as err:
        st.error(str(err))
        st.stop()
    live.markdown(f"```\n{prompt}{out.text}\n```")
    st.subheader("Measured at the client")
    c = st.columns(4)
    c[0].metric("TTFT", ms(out.ttft_s))
    c[1].metric("TPOT", ms(out.tpot_s))
    c[2].metric("Tokens/s", "—" if out.tokens_per_s is None else f"{out.tokens_per_s:,.1f}")
    c[3].metric("Gap between chunks, p50", ms(statistics.median(out.itl_s) if out.itl_s else None))
    st.caption(f"{out.completion_tokens or len(out.chunk_times)} tokens in {len(out.chunk_times)} chunks, "
               f"prompt {out.prompt_tokens if out.prompt_tokens is not None else '?'} tokens, finish: "
               f"{out.finish_reason or '?'}. Client-side times include the network and whatever else the "
               "kitchen was cooking.")  # fmt: skip
    if sure and out.token_logprobs:
        st.subheader("How sure the chef was of each token")
        st.markdown(confidence_html(out.token_logprobs), unsafe_allow_html=True)
        c = summarize(out.token_logprobs)
        st.caption(f"The probability the model gave each token it served, as the server measured it (exp of its "
                   f"logprob; hover a token). Mean {c.mean_p:.2f} over {c.tokens} tokens; {c.unsure} below 0.5; least "
                   f"sure of {c.least[0]!r} (p = {c.least[1]:.3f}).")  # fmt: skip
    elif sure:
        st.info("This server sent no logprobs with the answer, so how sure the model was of each token cannot be shown.")
    if out.server_steps:
        st.subheader("Measured by the kitchen")
        steps = pd.DataFrame(out.server_steps)
        busy = int(steps["batch"].max()) if "batch" in steps else 1
        st.markdown(
            f"Kitchen TTFT **{ms(out.server_ttft_s)}** (your order's arrival to its first token, without the "
            f"network). Your tokens came from {len(steps)} steps: "
            + ", ".join(f"{n} {p}" for p, n in steps["phase"].value_counts().items())
            + (f". Up to **{busy}** sequences were in the pot together in one step (yours included)."
               if busy > 1 else ". Yours was the only sequence in the pot.")
        )
    else:
        st.info("This server sends no per-step timings (vLLM and llama.cpp do not): the per-phase trace "
                "(wok vs pot) cannot be shown, only the client-side numbers above.")
    after = board(url, out.order_id, since=before["last_step"], api_key=api_key) if before is not None else None
    if after is not None:
        rail.markdown(rail_html(after), unsafe_allow_html=True)
        draw_whole_class(after, out.ttft_s, out.tpot_s, "client")

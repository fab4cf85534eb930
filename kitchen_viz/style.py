"""Page-wide style: presenter mode's large type, legible from the back of a classroom.

Streamlit sizes nearly everything in rem, so raising the root font size scales text, widgets and
metrics together; the drawn kitchen scales with the page width and gets its own larger labels.
"""

PRESENTER_ROOT_PX = 22  # Streamlit's default is 16 px


def page_css() -> str:
    """Let a measured number wrap instead of ending in "…": a panel is only useful whole."""
    return """<style>
    [data-testid="stMetricValue"] > div { overflow: visible; text-overflow: clip; white-space: normal; }
    </style>"""


def presenter_css() -> str:
    return f"""<style>
    html {{ font-size: {PRESENTER_ROOT_PX}px; }}
    [data-testid="stMetricValue"] {{ font-size: 2rem; }}  /* 44 px: TTFT, TPOT, tokens/s from the back row */
    [data-testid="stMetricLabel"] p {{ font-size: 1.1rem; }}
    /* the page's side margins stay at the normal size: the room goes to the kitchen's drawing */
    [data-testid="stMainBlockContainer"] {{ padding-left: 1rem; padding-right: 1rem; padding-top: 3rem; }}
    /* a page's title in one short line: at 1024 px the Kitchen's drawing starts on the first screen */
    [data-testid="stHeading"] h1 {{ font-size: 2.1rem; padding: 0.2rem 0 0.4rem 0; }}
    </style>"""

"""What `two-pot-kitchen` serves: the app (app.py) plus the live view's feed route.

Streamlit's `st.App` runs the same app.py with extra routes; `streamlit run serve.py` finds the
`app` below and serves it. The one extra route is the live view's feed (kitchen_viz/live_feed.py):
while an order cooks, the drawn kitchen follows its latest measurements as a stream instead of
the page rerunning four times a second, which measured cheaper for the browser that shares the
engine's machine (docs/benchmarks/ui-overhead.md). `streamlit run app.py` still works; the live
view then updates through fragment reruns. With `--class-kitchen` the class kitchen server is
mounted at /class on the same port (serving/http/mounted.py).
"""

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager

from kitchen_viz.live_feed import base_path, feed_routes
from lab.sweeps import LabSweeps
from serving.http.mounted import class_kitchen

# app.py builds the menu with st.navigation. Streamlit still treats a `pages/` folder beside the
# main script as an old-style multipage app until some session has called st.navigation, so the
# first visitor of a fresh server who arrives by a page's link (/lab_banquet) would get a bare
# page and a menu of file names. The pages here are st.navigation's only.
PagesManager.uses_pages_directory = False

# The app's own kitchen server: the class kitchen at /class, the Kitchen's kitchens, each running the Lab's sweeps too.
class_routes, class_lifespan = class_kitchen(base_path(), sweeps=LabSweeps())
app = st.App("app.py", routes=feed_routes() + class_routes, lifespan=class_lifespan)

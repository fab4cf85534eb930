"""What runs the engine for the app, without Streamlit: the model catalog, the kitchen host (every
Cook and every Lab sweep, whatever the launch), the one stove per machine, the instructor's caps.

    catalog         the allow-listed menu of models (catalog.toml + an instructor's extra files)
    caps            the instructor's caps per order (tokens, new tokens, seconds)
    job             Job: one order or sweep as the pages see it
    stove           one stove per device: kitchens of different models never cook at once
    cores           which cores the engine's loop keeps, how many threads it runs

The kitchen host (`two-pot-kitchen serve`, and the app's own: one continuous batch for everyone):
    server (the app and the command), kitchen_http (the routes), answer (OpenAI's response shapes),
    admission (the queue bound), auth (the key), engine_client, kitchen_loop and loop_messages (its
    engine process, its watchdog and their typed protocol, JSON on the pipe), openai_api, metrics,
    class_board; kitchen_orders and order_wire (the Kitchen's orders of B tables, every engine
    event, and `LocalHost`: those routes' code called in process); lab_wire (a Lab run's settings and result as JSON;
    the Lab's routes are lab/on_server.py, passed in as an extension); mounted (the hosts inside
    the app's own server); app_settings (what the launcher hands the app). Its clients reach it
    through host (`KitchenHost`: `LocalHost` in process, `HttpHost` over HTTP): kitchen_client (the
    Kitchen's and the Lab's; it takes the stove), remote_order (one measured
    order), loadgen (a class of simulated students), rush (overload: a rush, a slow reader), scrape
    (its /metrics), token_confidence (the Order page's per-token probabilities).

Import direction: entry points -> kitchen_viz/ -> lab/ -> serving/ -> engine/
(tests/test_import_graph.py). Nothing here imports streamlit, kitchen_viz or lab.
"""

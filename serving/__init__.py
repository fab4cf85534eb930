"""What runs the engine for the app and the class, without Streamlit: hosts, their HTTP server, their clients.

    host/       the engine host: one engine in its own process, every client's way to it
                  api (the `Host` interface, an order's form and its checked ids), host (`EngineHost`),
                  process (the child: start it, the pipe's writer and reader, restarts), loop (the
                  child's step loop), wire (every message on the pipe and its one codec), watchdog,
                  handles (each request's news)
    http/       the class kitchen server, an adapter over a host: server (the app and `two-pot-kitchen
                  serve`), openai_routes and openai_api (OpenAI's API), answer (its response shapes),
                  order_routes (the Kitchen's and the Lab's), auth, admission (the queue bound),
                  metrics, board (the class board), mounted (the hosts inside the app's own server)
    clients/    what reaches a host from outside: remote (`RemoteHost`, a host over HTTP),
                  remote_order (one measured order), loadgen (a class of simulated students), rush
                  (overload), scrape (its /metrics), token_confidence (per-token probabilities)
    host_client the pages' client of a host (`HostClient`): orders and sweeps as jobs
    job, stove  a page's job; one stove per machine (kitchens of different models take turns)
    catalog     the allow-listed menu of models (catalog.toml + an instructor's extra files)
    caps        the instructor's caps per order (tokens, new tokens, seconds)
    cores       which cores the engine's loop keeps, how many threads it runs
    app_settings  what the launcher hands the app (`AppSettings`)
    two_kitchens  prefill and decode on two engines (the Lab's disaggregation lesson)

Import direction: entry points -> kitchen_viz/ -> lab/ -> serving/ -> engine/
(tests/test_import_graph.py). Nothing here imports streamlit, kitchen_viz, lab or the engine's bench.
"""

"""Long-lived objects kept out of the garbage collector's full collections.

A full (generation 2) collection walks every object Python tracks; with torch, the tokenizer and a
web framework loaded that is hundreds of thousands of them, and every thread of the process waits
while it runs. Measured on the chef: in the class server a full collection paused the event loop
for 136 ms, and the 29 students who asked in that moment got their first token 3.5 times later than
the same class a second before; in the Kitchen, Streamlit forces `gc.collect(2)` after every script
run (each fragment rerun of the live view included, `runner.postScriptGC`), and py-spy measured each
at 0.3-1 s of the server's CPU with torch and plotly loaded.

`gc.freeze()` moves every object alive now to the permanent generation, so later collections walk
only what was created since (the Kitchen's: 0.21 s for the first collect and freeze, 7 ms for the
next). The price: cyclic garbage among the objects alive at a freeze is never reclaimed, so call it
once the process has loaded what it keeps (the server after its engine is ready, the engine's process
after its warm-up), or at a moment that stays out of a measurement (the Kitchen before each Cook).
"""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Collect what is garbage now, then keep everything still alive out of later collections."""
    gc.collect()
    gc.freeze()

"""Long-lived objects kept out of the garbage collector's full collections.

A full (generation 2) collection walks every object Python tracks; with torch, the tokenizer and a
web framework loaded that is hundreds of thousands of them, and every thread of the process waits
while it runs: in the class server every stream stalls, in the Kitchen the server's core stays busy
(Streamlit forces `gc.collect(2)` after every script run, each fragment rerun of the live view
included). docs/benchmarks/heap-freeze.md has the pauses measured.

`gc.freeze()` moves every object alive now to the permanent generation, so later collections walk
only what was created since. The price: cyclic garbage among the objects alive at a freeze is never
reclaimed, so call it once the process has loaded what it keeps (the server after its engine is
ready, the engine's process after its warm-up), or at a moment that stays out of a measurement (the
Kitchen before each Cook).
"""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Collect what is garbage now, then keep everything still alive out of later collections."""
    gc.collect()
    gc.freeze()

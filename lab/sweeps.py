"""The Lab on a host: its experiments run by key in the host's own engine process.

A sweep needs the engine in hand for seconds to minutes (controlled batches, the profiler, the
process's CPU time, caches and layouts a class kitchen does not run), so it does not join the
class's batch: the host's loop runs it between orders on an engine of its own
(serving/host/loop.py), and streams its points back. The host knows nothing of the lab (imports
point lab -> serving): whoever starts a host with the Lab hands it `LabSweeps()`, which the loop
receives when its process starts (the app's own kitchens, kitchen_viz/app_state.py and serve.py;
`two-pot-kitchen serve`, kitchen_viz/launch.py). A sweep then names its experiment by key, and
`run` finds it in the Lab's registry (lab/registry.py): no code and no module name travels.

So `two-pot-kitchen --backend http://GPU-BOX:8000` runs the Lab's sweeps on the GPU box, and the
app's own server runs them for it locally: one code path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.errors import EngineError
from lab.registry import EXPERIMENTS, experiment


class LabSweeps:
    """The Lab's experiments, as a host's loop runs them (serving/host/host.py `EngineHost.lab`)."""

    keys = tuple(e.key for e in EXPERIMENTS)

    def check(self, key: str, settings: Any) -> None:
        """Refuse (one line) an unknown experiment, or settings that are not its own."""
        try:
            exp = experiment(key)
        except KeyError as err:
            raise EngineError(str(err).strip("'\"")) from None
        if type(settings).__module__ != exp.run.__module__:
            raise EngineError(f"the settings of experiment '{key}' are its own (got {type(settings).__name__})")

    def run(self, engine, key: str, settings: Any, emit: Callable[[Any], None]) -> Any:
        """Experiment `key`'s sweep on `engine`, each finished point through `emit`."""
        self.check(key, settings)
        return experiment(key).run(engine, settings, emit)

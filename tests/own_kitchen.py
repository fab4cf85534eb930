"""The Kitchen's kitchen as the app runs it, for tests: a `ServerKitchen` on this process's own
kitchen host (serving/mounted.py's rooms, each engine in its kitchen-loop process, reached in
process through serving/host.py `LocalHost`), with the Lab's sweeps.

    with own_kitchen("chef") as (svc, kitchens):
        job = svc.submit(cook(order), order.label)
        loop_of(kitchens).pid          # the engine's kitchen-loop process
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from lab.on_server import LabRoutes
from serving.engine_client import EngineClient
from serving.kitchen_client import ServerKitchen
from serving.mounted import AppKitchens, KitchenRooms

WAIT_S = 120


@contextmanager
def own_kitchen(model: str = "chef", device: str = "cpu", dtype: str = "float32", **kw):
    """Yields (the ready ServerKitchen, the AppKitchens it cooks in); closes both after."""
    kitchens = AppKitchens(None, KitchenRooms(None, (LabRoutes,)))
    svc = ServerKitchen(kitchens.host(model, device, dtype), model, device, dtype, **kw)
    try:
        assert svc.wait_ready(WAIT_S) and svc.state == "ready", svc.load_error
        yield svc, kitchens
    finally:
        svc.close()
        kitchens.rooms.close()


def loop_of(kitchens: AppKitchens, model: str = "chef", device: str = "cpu", dtype: str = "float32") -> EngineClient:
    """The engine client of that kitchen: its loop's pid, what is in flight, its restarts."""
    return kitchens.app_for(model, device, dtype).state.kitchen.client


def nothing_in_flight(client: EngineClient) -> bool:
    return client.in_flight == 0 and client.state.running == 0 and client.state.waiting == 0


def wait_for(predicate, seconds: float = WAIT_S) -> bool:
    """Poll `predicate` every 50 ms until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False

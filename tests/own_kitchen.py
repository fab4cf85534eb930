"""The Kitchen's kitchen as the app runs it, for tests: a `HostClient` on this process's own host
(serving/http/mounted.py's rooms, each engine in its loop process, called directly), with the
Lab's sweeps.

    with own_kitchen("chef") as (svc, hosts):
        job = svc.submit(svc.check(order.form()), order.label)
        process_of(hosts).pid          # the engine's loop process
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from lab.sweeps import LabSweeps
from serving.host.process import EngineProcess
from serving.host_client import HostClient
from serving.http.mounted import AppHosts, HostRooms

WAIT_S = 120


@contextmanager
def own_kitchen(model: str = "chef", device: str = "cpu", dtype: str = "float32", **kw):
    """Yields (the ready HostClient, the AppHosts it cooks in); closes both after."""
    hosts = AppHosts(None, HostRooms(None, LabSweeps()))
    svc = HostClient(lambda: hosts.host_for(model, device, dtype), model, device, dtype, **kw)
    try:
        assert svc.wait_ready(WAIT_S) and svc.state == "ready", svc.load_error
        yield svc, hosts
    finally:
        svc.close()
        hosts.rooms.close()


def process_of(hosts: AppHosts, model: str = "chef", device: str = "cpu", dtype: str = "float32") -> EngineProcess:
    """The engine process of that kitchen: its pid, what is in flight, its restarts."""
    return hosts.host_for(model, device, dtype).process


def nothing_in_flight(process: EngineProcess) -> bool:
    return process.in_flight == 0 and process.state.running == 0 and process.state.waiting == 0


def wait_for(predicate, seconds: float = WAIT_S) -> bool:
    """Poll `predicate` every 50 ms until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False

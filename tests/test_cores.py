"""Which cores the engine's kitchen loop keeps, and how many torch threads it runs (serving/cores.py).

The loop here is the real one the app starts for a kitchen (serving/http/mounted.py `loop_settings`),
pinned before it imports torch.
"""

from __future__ import annotations

import os

import pytest
from conftest import use_settings
from own_kitchen import own_kitchen, process_of

from serving import cores
from serving.cores import CoreSplit, engine_threads, split_cores

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_the_app_leaves_one_core_to_the_page_unless_told_otherwise(monkeypatch):
    use_settings(monkeypatch)
    assert engine_threads() == max(1, (os.cpu_count() or 2) - 1)
    use_settings(monkeypatch, threads=3)  # `two-pot-kitchen --threads 3`
    assert engine_threads() == 3


def test_core_split_examples(monkeypatch):
    monkeypatch.setattr(cores, "ALL_CORES", frozenset({0, 1, 2, 3}))
    use_settings(monkeypatch)
    assert split_cores(1) == CoreSplit(engine=frozenset({3}), server=frozenset({0, 1, 2}))
    assert split_cores(2) == CoreSplit(engine=frozenset({2, 3}), server=frozenset({0, 1}))
    assert split_cores(4) is None and split_cores(None) is None  # no core left for the server
    use_settings(monkeypatch, pin=False)  # `two-pot-kitchen --no-pin`
    assert split_cores(1) is None


def test_the_kitchen_loop_keeps_its_own_cores_when_there_are_cores_to_spare(monkeypatch):
    use_settings(monkeypatch, threads=1)
    split = split_cores(1)
    if split is None:
        pytest.skip("a single core: nothing to split")
    with own_kitchen("chef") as (svc, kitchens):
        pid = process_of(kitchens).pid
        assert pid != os.getpid() and svc.engine_pid == pid  # the engine runs in another process
        assert os.sched_getaffinity(pid) == split.engine
        assert os.sched_getaffinity(0) != split.engine  # the test process itself was not pinned

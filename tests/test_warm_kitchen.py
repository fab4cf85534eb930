"""The launcher loads what it fetches before anyone orders it: after a restart, choosing the assistant
finds its weights already loaded (serving/http/mounted.py `warm`)."""

from __future__ import annotations

import fcntl
import threading
import time

from conftest import launched, use_settings

from engine import model_store
from kitchen_viz.launch import PREFETCH_ENV
from serving.caps import load_caps
from serving.http.mounted import CLASS_DEVICE, CLASS_DTYPE, HostRooms, loop_settings, warm
from serving.http.server import open_host

KEY = ("assistant", CLASS_DEVICE, CLASS_DTYPE)


def test_the_launcher_warms_the_models_it_fetches_and_only_those(monkeypatch, capsys):
    monkeypatch.setenv(PREFETCH_ENV, "1")
    assert launched([], capsys)[1].warm == ("assistant",)
    assert launched(["--no-fetch"], capsys)[1].warm == ()
    assert launched(["--backend", "http://127.0.0.1:9"], capsys)[1].warm == ()  # no kitchens of its own
    monkeypatch.setenv(PREFETCH_ENV, "0")  # the suite's setting
    assert launched([], capsys)[1].warm == ()


def test_a_cached_model_is_loaded_before_its_first_order(assistant, monkeypatch):
    for k, v in assistant.env.items():
        monkeypatch.setenv(k, v)
    use_settings(monkeypatch, kitchens=True)
    rooms = HostRooms(None)
    try:
        assert warm(rooms, ("assistant",), poll_s=0.05) == ["assistant"]
        host = rooms.rooms[KEY].host
        assert host.wait_ready(180), host.status
        assert host.about()["name"] == "assistant" and host.about()["chat_template"] is not None
    finally:
        rooms.close()


def test_a_model_still_being_fetched_is_loaded_when_its_fetch_lands(assistant, tmp_path, monkeypatch):
    """The fetch's lock held (a fetch in flight) and nothing cached: warm waits; the converted folder
    appears and the lock is released (the fetch ended): warm opens its kitchen."""
    for k, v in assistant.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(model_store.CACHE_ENV, str(tmp_path / "cache"))
    use_settings(monkeypatch, kitchens=True)
    folder = model_store.folder_of("assistant")
    folder.parent.mkdir(parents=True)
    rooms, opened = HostRooms(None), []
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert model_store.fetching("assistant")
        waiter = threading.Thread(target=lambda: opened.extend(warm(rooms, ("assistant",), poll_s=0.05)))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not rooms.rooms  # nothing to load yet: it waits for the fetch
        folder.symlink_to(assistant.folder)  # the fetch's last step: the converted folder appears whole
        fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        waiter.join(30)
        assert not waiter.is_alive() and opened == ["assistant"]
        assert rooms.rooms[KEY].host.wait_ready(180), rooms.rooms[KEY].host.status
    finally:
        rooms.close()


def test_a_model_neither_cached_nor_being_fetched_is_left_to_the_page(tmp_path, monkeypatch):
    monkeypatch.setenv(model_store.CACHE_ENV, str(tmp_path / "empty"))
    use_settings(monkeypatch, kitchens=True)
    rooms = HostRooms(None)
    assert warm(rooms, ("assistant", "no-such-model"), poll_s=0.05) == []
    assert not rooms.rooms


def test_a_model_the_class_kitchen_serves_is_not_loaded_twice(monkeypatch):
    """`--class-kitchen assistant`: the Kitchen's float32 CPU orders for it go to the class kitchen."""
    use_settings(monkeypatch, kitchens=True, class_model="chef")
    rooms = HostRooms(None)
    assert warm(rooms, ("chef",), poll_s=0.05) == []
    assert not rooms.rooms


def test_the_class_kitchen_loads_first(monkeypatch):
    """The page a teacher opens first cooks on the class kitchen (the chef): warm waits for it."""
    use_settings(monkeypatch, kitchens=True)
    first = open_host("chef", loop_settings("chef", CLASS_DEVICE, CLASS_DTYPE), load_caps(None))
    rooms = HostRooms(None)
    try:
        assert warm(rooms, ("chef",), first, poll_s=0.05) == ["chef"]
        assert first.ready  # loaded before warm opened anything
        assert rooms.rooms[("chef", CLASS_DEVICE, CLASS_DTYPE)].host.wait_ready(120)
    finally:
        rooms.close()
        first.close()

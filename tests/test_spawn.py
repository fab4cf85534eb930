"""A host's loop starts with the parent's environment as it is at that moment, forked from the fork
server on Linux (serving/host/spawn.py), even when the fork server started long before with another."""

from __future__ import annotations

import os
import sys

from serving.host import spawn
from serving.host.loop import LoopSettings

PROBE = "TWO_POT_SPAWN_PROBE"


def echo(conn, settings, sweeps, environment) -> None:
    """A loop's entry that says what it inherited, what it was given, and who its parent is."""
    conn.send((os.environ.get(PROBE), environment.get(PROBE), os.getppid()))
    conn.close()


def start_and_hear() -> tuple:
    proc, conn = spawn.start_loop(echo, LoopSettings("chef"), None)
    try:
        return conn.recv()
    finally:
        proc.join(30)
        assert proc.exitcode == 0


def test_a_loop_is_given_the_parents_environment_as_it_is_when_it_starts(monkeypatch):
    assert spawn.CONTEXT.get_start_method() == ("forkserver" if sys.platform == "linux" else "spawn")
    monkeypatch.delenv(PROBE, raising=False)
    start_and_hear()  # the fork server (Linux) runs from here on, with no probe in its environment
    monkeypatch.setenv(PROBE, "set after the first loop started")
    inherited, given, parent = start_and_hear()
    assert given == "set after the first loop started"
    forked = spawn.CONTEXT.get_start_method() == "forkserver"
    assert (inherited is None) == forked  # a forked loop starts with the fork server's environment
    assert (parent != os.getpid()) == forked  # and is the fork server's child, not this process's

"""Child processes in tests: when one fails, the test says what the child said, not only that it failed.

A test that runs a command and then fails with `assert 1 == 0`, `JSONDecodeError` or `Command ...
timed out after 300 seconds` hides the cause, and on a busy machine the cause is often the point
(a start-up that ran out of time, a browser that would not launch). So every child a test runs goes
through one of these:

    done = run([sys.executable, "-m", "engine", "info"], timeout=120)   # exit 0, or the test fails
    done = run(cmd, timeout=120, check=False)                           # any exit; then
    assert done.returncode == 2, said(done)                             # the message shows its stderr
    with telling(proc, log_path, "the kitchen server"):                 # a long-lived child's log:
        ...                                                             # shown when the block fails

`run` captures stdout and stderr as text. A timeout fails the test with the output the child had
written by then (a hang and a slow start-up look different there).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TAIL_CHARS = 3000  # of each stream in a failure message: the end says why; the whole goes to a log


def _text(stream: str | bytes | None) -> str:
    if isinstance(stream, bytes):
        return stream.decode(errors="replace")
    return stream or ""


def _tail(stream: str | bytes | None) -> str:
    text = _text(stream).rstrip()
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def _shown(args) -> str:
    return shlex.join(str(a) for a in args) if isinstance(args, list | tuple) else str(args)


def said(done: subprocess.CompletedProcess | subprocess.TimeoutExpired) -> str:
    """The command, how it ended, and the end of its stderr and stdout: a failure message."""
    if isinstance(done, subprocess.TimeoutExpired):
        head = f"`{_shown(done.cmd)}` did not finish in {done.timeout:g} s"
    else:
        head = f"`{_shown(done.args)}` exited {done.returncode}"
    return f"{head}\n--- its stderr ---\n{_tail(done.stderr)}\n--- its stdout ---\n{_tail(done.stdout)}"


def run(args: list, *, timeout: float, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` with stdout and stderr captured as text; a timeout, or with `check` an exit
    code other than 0, fails the test with `said` (the command and what it wrote)."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as err:
        pytest.fail(said(err), pytrace=False)
    if check and done.returncode != 0:
        pytest.fail(said(done), pytrace=False)
    return done


@contextmanager
def telling(proc: subprocess.Popen, log: Path, what: str) -> Iterator[None]:
    """While the block runs, a failure in it (the test's, or the child's start-up) prints the end of
    the child's log to stderr, which pytest shows beside the failure. Around a fixture's `yield` it
    covers the start-up (pytest does not raise a test's failure inside its fixtures)."""
    try:
        yield
    except BaseException:
        ended = "still running" if proc.poll() is None else f"exited {proc.returncode}"
        text = Path(log).read_text(errors="replace") if Path(log).exists() else "(no log written)"
        print(f"--- {what} ({ended}): the end of {log} ---\n{_tail(text)}", file=sys.stderr)
        raise

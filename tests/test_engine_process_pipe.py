"""The server never blocks on the pipe to its engine process.

The host writes every message to its loop from its event loop, and the loop answers every
one (Accepted, then the steps). Both directions of the pipe are bounded kernel buffers: if the
host wrote while holding the lock its reader needs, a rush that filled both at once would stop the
server for good (its reader waiting for the lock, the writer for a child that is itself waiting to
write). Here the child is really stopped (SIGSTOP) while a rush is sent: the event loop must keep
running, and once the child resumes every request is answered in full.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

from engine.settings import EngineSettings
from serving.clients.rush import PROMPTS
from serving.host.loop import LoopSettings
from serving.host.process import EngineProcess

RUSH = 1000  # far more messages than the pipe's buffer holds


def test_a_child_that_stops_reading_never_blocks_the_event_loop():
    client = EngineProcess(LoopSettings("chef", EngineSettings(policy="chunked", token_budget=64), threads=1))
    pid = client.pid
    ticks: list[float] = []
    answers: dict = {}

    async def rush() -> None:
        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.02)

        async def one(i: int) -> tuple[int, list, str]:
            handle = await client.submit(PROMPTS[i % len(PROMPTS)], 4, {"temperature": 0.0})
            ids, end = [], ""
            async for kind, value in handle:
                if kind == "token":
                    ids.append(value.token_id)
                end = kind
            return i, ids, end

        tick = asyncio.create_task(ticker())
        for i, ids, end in await asyncio.gather(*(one(i) for i in range(RUSH))):
            answers[i] = (ids, end)
        tick.cancel()

    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=lambda: asyncio.run(rush()), daemon=True)
    try:
        thread.start()
        time.sleep(3)  # the rush is sent into a pipe nobody reads
        seen = len(ticks)
        time.sleep(1)
        ran = len(ticks) - seen  # ~50 if the event loop runs, 0 if it is stuck in a write
        os.kill(pid, signal.SIGCONT)
        thread.join(180)
        stuck = thread.is_alive()
    finally:
        os.kill(pid, signal.SIGCONT)
        if thread.is_alive():
            os.kill(pid, signal.SIGKILL)  # a stuck host: free it so the test ends
    try:
        assert ran >= 10, f"the event loop ran {ran} times in 1 s while the child was stopped"
        assert not stuck, "the rush was not answered within 180 s of the child resuming"
        assert len(answers) == RUSH and all(end == "done" and len(ids) == 4 for ids, end in answers.values())
        alone = {p: answers[i][0] for i, p in enumerate(PROMPTS)}
        assert all(ids == alone[PROMPTS[i % len(PROMPTS)]] for i, (ids, _) in answers.items())
    finally:
        client.close()

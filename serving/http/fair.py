"""Fair admission: the kitchen's seats go round-robin across clients, and each client has a cap.

Why: a continuous batch serves its line first come, first served, so one student's script that sends
200 requests at once puts every classmate behind all 200 (measured on the chef: the class's first
token went from p99 0.12 s to 5.2 s). Here every request first takes a place in its client's own line;
whenever a seat is free, the next client in turn sends its oldest request to the engine, so a
classmate who sends one request waits for at most one request of each other client, never for a
whole flood. And a client holding `max_client_orders` requests (cooking or waiting, the caps file,
serving/caps.py) is refused at once: HTTP 429, one line, `Retry-After` (the kitchen's recent time per
order, serving/http/admission.py). Nobody else is refused for it.

Who is a client (`client_of`): its API key, when it sends one of its own (not the class's shared
key, which names the class, not a student), else the request's OpenAI `user` field, else the
connection's address. A client is shown on the class board as a number and a count, never its key,
name, address or text.

    line = FairLine(seats=64, cap=16, alive=process.holds)
    ticket = line.enter("user:ada", 1)       # OverCap (429) past the cap; else a place in ada's line
    await ticket.wait()                      # her turn: a seat is hers
    line.seated(ticket, ["r7"])              # the engine's keys; `ended("r7")` when it leaves the engine

Counting: a request holds its place from `enter` until the engine is done with it (`ended`, told by
the engine process's reader thread), or until it fails before reaching the engine (`leave`).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.http.openai_api import ApiError


class OverCap(ApiError):
    """429: this client holds its cap of requests; `retry_after` seconds, measured."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(429, message, kind="rate_limit_error")
        self.retry_after = retry_after


def client_of(authorization: str, user: object, address: str | None, class_key: str | None) -> str:
    """Who sent a request: its own API key, else the OpenAI `user` field, else its address."""
    key = authorization[len("Bearer "):].strip() if authorization.startswith("Bearer ") else ""
    if key and key != class_key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]  # never kept in the clear
    if isinstance(user, str) and user.strip():
        return "user:" + user.strip()[:200]
    return "address:" + (address or "unknown")


@dataclass(eq=False)
class Ticket:
    """One request's place: `tables` seats, for client `who`, released by its line."""

    who: str
    tables: int
    future: asyncio.Future | None = None  # None: it had a seat at once
    state: str = "waiting"  # waiting -> released -> seated | left

    async def wait(self) -> None:
        if self.future is not None:
            await self.future


@dataclass
class Client:
    number: int  # what the board shows instead of who it is
    line: deque = field(default_factory=deque)  # tickets waiting for a seat, oldest first
    released: int = 0  # seats given to tickets not yet seated in the engine
    keys: set = field(default_factory=set)  # the engine's keys of its requests cooking or waiting there

    @property
    def held(self) -> int:
        return sum(t.tables for t in self.line) + self.released + len(self.keys)


class FairLine:
    """Per-client lines in front of the engine's `seats`, served round-robin; thread-safe (the
    engine's reader thread calls `ended`, the server's event loop everything else)."""

    def __init__(self, seats: int, cap: int, alive: Callable[[str], bool], retry_after: Callable[[], int] = lambda: 1,
                 on_over: Callable[[], None] = lambda: None):  # fmt: skip
        self.seats, self.cap, self.alive, self.retry_after, self.on_over = seats, cap, alive, retry_after, on_over
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}
        self._turns: OrderedDict[str, None] = OrderedDict()  # clients with a ticket waiting, in turn order
        self._owner: dict[str, str] = {}  # engine key -> client
        self.over = 0  # requests refused for their client's cap

    @property
    def waiting(self) -> int:
        """Seats asked for by tickets still in line. Under the lock: the reader thread's `ended`
        pops tickets off the lines while the event loop counts them."""
        with self._lock:
            return sum(sum(t.tables for t in c.line) for c in self._clients.values())

    def _cooking(self) -> int:
        """Under the lock: seats given out (released, or held by requests in the engine)."""
        return sum(c.released + len(c.keys) for c in self._clients.values())

    def enter(self, who: str, tables: int) -> Ticket:
        """A place in `who`'s line (a seat at once when nobody waits and one is free); OverCap past the cap."""
        with self._lock:
            client = self._clients.setdefault(who, Client(len(self._clients) + 1))
            if client.held + tables > self.cap:
                self.over += 1
                self.on_over()
                raise OverCap(f"you have {client.held:,} requests cooking or waiting in this kitchen; the instructor's "
                              f"limit is {self.cap:,} per client (max_client_orders); retry in {self.retry_after()} s",
                              self.retry_after())  # fmt: skip
            ticket = Ticket(who, tables)
            if not self._turns and self._cooking() + tables <= max(self.seats, tables):
                ticket.state = "released"
                client.released += tables
                return ticket
            ticket.future = asyncio.get_running_loop().create_future()
            client.line.append(ticket)
            self._turns.setdefault(who, None)
            return ticket

    def seated(self, ticket: Ticket, keys: list[str]) -> None:
        """The ticket's requests reached the engine under `keys` (those already ended are not counted)."""
        with self._lock:
            client = self._clients[ticket.who]
            client.released -= ticket.tables
            ticket.state = "seated"
            for key in keys:
                if self.alive(key):
                    client.keys.add(key)
                    self._owner[key] = ticket.who
            self._release()

    def leave(self, ticket: Ticket) -> None:
        """The ticket gives up its place (refused, failed or its client gone) before `seated`."""
        with self._lock:
            client = self._clients[ticket.who]
            if ticket.state == "waiting":
                client.line.remove(ticket)
                if not client.line:
                    self._turns.pop(ticket.who, None)
            elif ticket.state == "released":
                client.released -= ticket.tables
            ticket.state = "left"
            self._release()

    def ended(self, key: str) -> None:
        """The engine is done with `key` (finished, cancelled, refused or failed): its seat is free."""
        with self._lock:
            who = self._owner.pop(key, None)
            if who is not None:
                self._clients[who].keys.discard(key)
                self._release()

    def board(self, me: str | None) -> list[dict]:
        """Each client holding requests: its number and how many it holds; `mine` for the caller's own."""
        with self._lock:
            return [{"client": c.number, "orders": c.held, "mine": who == me}
                    for who, c in self._clients.items() if c.held]  # fmt: skip

    def _release(self) -> None:
        """Under the lock: free seats go to the waiting clients in turn, one ticket each."""
        while self._turns:
            who = next(iter(self._turns))
            client = self._clients[who]
            ticket = client.line[0]
            cooking = self._cooking()
            if cooking and cooking + ticket.tables > self.seats:
                return
            client.line.popleft()
            del self._turns[who]
            if client.line:
                self._turns[who] = None  # its next ticket waits for everyone else's turn
            ticket.state = "released"
            client.released += ticket.tables
            ticket.future.get_loop().call_soon_threadsafe(_resolve, ticket.future)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)

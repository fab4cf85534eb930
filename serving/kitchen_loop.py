"""The class kitchen's engine process: one Engine, one step loop, every student's order in it.

The server (serving/server.py) never touches torch: it starts this loop as a child process and
talks to it over one pipe. The loop owns the Engine (an Engine is not thread-safe), so every
submit and cancel is a message it applies between two steps, and every step's events go back as
one message. Orders from different students join the same running batch at the next step.

Messages, parent -> child:
    ("submit", key, prompt, max_new_tokens, settings)   prompt: text or token ids; settings: the
                                                        engine's (temperature, top_p, seed, ...)
    ("order", key, prompts, max_new_tokens, settings)   the Kitchen's order: its tables join the batch as
                                                        requests "key/0", "key/1", ... (engine/shared_order.py)
    ("ask", key, "limits" | "check", args)               the order form's questions, answered between steps
    ("cancel", key)                                      a request or a whole order
    None                                                 finish and exit
child -> parent:
    ("ready", ReadyInfo)                  once, after loading and warming up
    ("load_error", line)                  instead of ready; the child exits
    ("accepted", key, prompt_tokens)      or ("refused", key, line): the engine's one-line refusal
    ("order_accepted", key, [prompt_tokens per table])
    ("answer", key, ok, value)            value: a dict (limits), token-id lists (check) or the refusal line
    ("steps", [(StepInfo | None, tokens, done, QueueState, orders), ...])
                                          after each step (or every BATCH_S, while only Kitchen orders
                                          cook: see the loop): orders = [(key, [event dicts], end)], the
                                          Kitchen's orders' own events (serving/order_wire.py; end is
                                          None while one cooks, then "done" or "cancelled");
                                          tokens = [(key, token_id, text, index,
                                          finished, ttft_s)] (ttft_s: arrival here -> this first
                                          token, measured when its step returned; else None), done = [(key, RequestResult)]; StepInfo is None
                                          when the step only applied cancellations
The key is the parent's name for a request (a string); the engine's request ids stay here.

Run as `python -c "from serving.kitchen_loop import entry; ..." FD SETTINGS_JSON` (LoopSettings
as JSON; serving/engine_client.py does this).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

from serving.watchdog import TEST_HANG_ENV

ENTRY_CODE = "import sys; from serving.kitchen_loop import entry; entry(sys.argv[1:])"
IDLE_POLL_S = 1.0  # an idle loop wakes this often to notice a parent that went away
BATCH_S = 0.05  # while only Kitchen orders cook, their steps go to the server together this often


@dataclass(frozen=True)
class LoopSettings:
    """What the kitchen loop loads and how it schedules (`two-pot-kitchen serve`'s options)."""

    model: str = "chef"
    device: str = "cpu"
    dtype: str = "float32"
    policy: str = "chunked"
    token_budget: int = 512
    max_seqs: int = 64
    threads: int = 0  # 0: torch's default
    prefix_cache: bool = True  # a class's orders often share a system prompt
    cores: tuple[int, ...] = ()  # pin the loop's process to these cores (serving/cores.py); () = any


@dataclass(frozen=True)
class ReadyInfo:
    model: str
    device: str
    dtype: str
    policy: str
    max_context: int
    vocab_size: int
    seats: int
    kv_tokens: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    load_s: float
    model_info: dict | None = None  # engine.loader.ModelInfo as a dict (the Kitchen's caption and costs)
    token_budget: int = 0


@dataclass(frozen=True)
class StepInfo:
    """One step of the kitchen, for the server's metrics and each token's `timings`."""

    index: int
    phase: str  # "prefill", "decode" or "mixed"
    seconds: float
    batch: int
    prefill_tokens: int
    decode_tokens: int
    kv_bytes: int
    keys: tuple[str, ...] = ()  # the requests in the step, by the parent's keys (the class board)
    wall_t: float = 0.0  # time.time() when the step ended (steps may reach the server in batches)


@dataclass(frozen=True)
class QueueState:
    """The scheduler after a step: the server's gauges and prefix-cache counters."""

    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV memory held (running sequences and leftovers)
    prefix_queries: int = 0  # prompt tokens looked up, since the engine started
    prefix_hits: int = 0


def entry(argv: list[str]) -> None:
    fd, settings = argv
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (engine/__init__.py)
    s = json.loads(settings)
    s["cores"] = tuple(s.get("cores", ()))
    if s["cores"]:  # before torch starts its threads, so every one of them inherits it
        os.sched_setaffinity(0, set(s["cores"]))
    run(Connection(int(fd)), LoopSettings(**s))


def run(conn, s: LoopSettings) -> None:
    t0 = time.perf_counter()
    model, policy = s.model, s.policy
    try:
        from engine import Engine, EngineError  # lazy: torch loads after OMP_WAIT_POLICY is set

        if s.threads:
            import torch  # lazy: after the wait policy, as above

            torch.set_num_threads(s.threads)
        from engine.quant import precision_parts  # lazy: imports torch, as above

        dtype, quant = precision_parts(s.dtype)  # `--dtype int8`: int8 matrices, float32 for the rest
        engine = Engine.load(model, s.device, dtype, policy=policy, token_budget=s.token_budget,
                             max_seqs=s.max_seqs, prefix_cache=s.prefix_cache, quant=quant)  # fmt: skip
        warm = engine.submit([1], 2)  # first-call setup stays out of the first student's TTFT
        while not engine.idle:
            engine.step()
        del warm
    except Exception as err:  # noqa: BLE001 -- the parent gets one line, whatever went wrong
        conn.send(("load_error", " ".join(f"could not load {model}: {err}".split())))
        return
    codec = engine.codec
    special = (lambda i: codec.decode([i]) if i is not None else "") if codec is not None else (lambda i: "")
    lim = engine.serving_limits()
    conn.send(("ready", ReadyInfo(
        engine.info.name, str(engine.device), engine.info.precision, policy, engine.cfg.max_context,
        engine.cfg.vocab_size, lim.seats, lim.kv_tokens, getattr(codec, "chat_template", None),
        special(engine.cfg.bos_id), special(next(iter(engine.cfg.eos_ids), None)), time.perf_counter() - t0,
        asdict(engine.info), s.token_budget,
    )))  # fmt: skip
    serve(conn, engine, EngineError)


def serve(conn, engine, EngineError) -> None:  # noqa: N803 -- the engine's exception class, imported late
    from engine.events import Done, StepEnd, Token  # lazy: the engine loads in the child, after `entry`
    from engine.shared_order import SharedOrder, shared_check, shared_limits  # lazy: as above
    from serving.order_wire import to_wire  # lazy: it imports the engine, as above

    key_of: dict[int, str] = {}
    id_of: dict[str, int] = {}
    arrived: dict[str, float] = {}
    orders: dict[str, SharedOrder] = {}
    held: list[tuple] = []  # steps not yet sent (see BATCH_S)
    hang_s = float(os.environ.get(TEST_HANG_ENV) or 0)
    sent_at = time.perf_counter()
    while True:
        if not conn.poll(0 if not engine.idle else IDLE_POLL_S) and engine.idle:
            continue
        while conn.poll(0):  # apply everything that arrived, then step
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            if msg[0] == "submit":
                _, key, prompt, max_new, settings = msg
                try:
                    rid = engine.submit(prompt, max_new, **settings)
                except EngineError as err:
                    conn.send(("refused", key, str(err)))
                    continue
                key_of[rid], id_of[key], arrived[key] = key, rid, time.perf_counter()
                conn.send(("accepted", key, len(engine.serving.seqs[rid].prompt)))
            elif msg[0] == "order":
                _, key, prompts, max_new, settings = msg
                try:
                    order = SharedOrder(engine, prompts, max_new, **settings)
                except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
                    conn.send(("refused", key, " ".join(str(err).split())))
                    continue
                orders[key] = order
                for table, rid in enumerate(order.rids):
                    key_of[rid] = f"{key}/{table}"
                    arrived[key_of[rid]] = time.perf_counter()
                conn.send(("order_accepted", key, [len(p) for p in order.prompts]))
            elif msg[0] == "ask":
                _, key, name, args = msg
                try:
                    if name == "limits":
                        value = asdict(shared_limits(engine, *args))
                    else:
                        prompts, max_new, settings = args
                        value = shared_check(engine, prompts, max_new, **settings)
                    conn.send(("answer", key, True, value))
                except Exception as err:  # noqa: BLE001 -- a refusal (or a bug) is one line, the kitchen goes on
                    conn.send(("answer", key, False, " ".join(str(err).split())))
            elif msg[0] == "cancel" and msg[1] in orders:
                orders[msg[1]].cancel()
            elif msg[0] == "cancel" and msg[1] in id_of:
                engine.cancel(id_of[msg[1]])
        if engine.idle:
            continue
        events = engine.step()
        if hang_s:  # a test's slow engine: alive, a pause after every step (serving/watchdog.py)
            time.sleep(hang_s)
        now = time.perf_counter()
        tokens, done, info, order_news = [], [], None, []
        for key, order in list(orders.items()):
            taken = order.take(events)
            end = None if not order.done else "cancelled" if order.cancelled else "done"
            if taken or end:
                order_news.append((key, [to_wire(e) for e in taken], end))
            if end:
                del orders[key]
        for ev in events:
            if isinstance(ev, Token):
                key = key_of[ev.request_id]
                ttft = now - arrived[key] if ev.step == 0 else None
                tokens.append((key, ev.token_id, ev.text, ev.step, ev.finished, ttft))
            elif isinstance(ev, Done):
                key = key_of.pop(ev.request_id)
                id_of.pop(key, None)
                arrived.pop(key, None)
                done.append((key, ev.result))
            elif isinstance(ev, StepEnd):
                rec = ev.step
                keys = tuple(key_of[r] for r in ev.request_ids if r in key_of)
                info = StepInfo(rec.index, rec.phase, rec.seconds, rec.batch, ev.prefill_tokens,
                                ev.decode_tokens, rec.kv_bytes, keys, time.time())  # fmt: skip
        if info is not None or done or order_news:
            state = engine.serving_state()
            queue = QueueState(state.running, state.waiting, state.kv_usage, state.prefix_queries, state.prefix_hits)
            held.append((info, tokens, done, queue, order_news))
        # Every step goes out at once while a request streams to a client; while only the Kitchen's
        # orders cook (their pages read every 250 ms) the steps go out together every BATCH_S, so
        # the server process is woken 20 times a second, not at every step (its cores are the
        # browser's: docs/benchmarks/ui-overhead.md).
        only_orders = len(key_of) == sum(len(o.rids) for o in orders.values())
        if held and (not only_orders or done or engine.idle or now - sent_at >= BATCH_S):
            conn.send(("steps", held))
            held, sent_at = [], now


if __name__ == "__main__":
    entry(sys.argv[1:])

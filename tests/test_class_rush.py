"""A rush bigger than the room, on the real chef in its own server process (loopback, bounded):

- 1,000 streaming clients at once under the default queue bound: every one answered in full, each
  answer equal to its prompt served alone, memory bounded, the server normal afterwards;
- a small bound (`--max-seqs 4 --max-waiting 4`): past it requests are refused at once with 503,
  Retry-After and one line, and every admitted one is answered correctly;
- a client reading its stream a few hundred bytes at a time never holds the batch back: the class
  ordering beside it is answered while it is far behind, and its own answers are still right.
"""

from __future__ import annotations

import httpx
from kitchen_server import kitchen_process

from serving.clients.rush import gauge, rush, slow_reader

RSS_GROWTH = 0.25  # the server and its engine after a 1,000-client rush, against before it


def test_a_thousand_streams_at_once_are_all_answered_unmixed():
    with kitchen_process() as (url, proc):
        r = rush(url, proc.pid, 1000, max_tokens=8)
        print(f"\nrush of 1,000: {r}")
        assert (r.answered, r.refused, r.errors, r.mismatches) == (1000, 0, [], 0)
        assert r.rss_kb_after < r.rss_kb_before * (1 + RSS_GROWTH), (r.rss_kb_before, r.rss_kb_after)
        assert r.running_after == 0
        answer = httpx.post(url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 4, "temperature": 0},
                            timeout=30)  # fmt: skip
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4


def test_past_the_bound_requests_are_refused_at_once_in_one_line():
    with kitchen_process("--max-seqs", "4", "--max-waiting", "4") as (url, proc):
        about = httpx.get(url + "/kitchen").json()
        assert about["caps"]["max_waiting"] == 4 and about["queue"]["bound"] == about["seats"] + 4
        r = rush(url, proc.pid, 40, max_tokens=48)
        print(f"\nrush of 40 against a bound of {about['queue']['bound']}: {r}")
        assert r.answered >= about["queue"]["bound"] and r.refused >= 1 and r.answered + r.refused == 40
        assert r.errors == [] and r.mismatches == 0  # nothing admitted is lost or mixed
        assert all("\n" not in line and "max_waiting" in line and "is full" in line for line in r.refusal_lines)
        assert r.retry_after and all(v.isdigit() and int(v) >= 1 for v in r.retry_after)
        assert gauge(url, "request_refused_total") == r.refused
        again = httpx.post(url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 4}, timeout=30)
        assert again.status_code == 200  # the line drained: the kitchen takes orders again
        tables = about["queue"]["bound"] + 1  # a Kitchen order's tables count as requests too
        big = httpx.post(url + "/kitchen/orders", json={"model": "chef", "prompts": ["hi"] * tables, "max_new_tokens": 4},
                         timeout=30)  # fmt: skip
        assert big.status_code == 503 and big.headers["retry-after"].isdigit() and "max_waiting" in big.json()["error"]["message"]


def test_a_slow_reader_never_holds_the_batch_back():
    with kitchen_process() as (url, proc):
        s = slow_reader(url, tables=8, max_tokens=400, others=30)
        print(f"\nslow reader: {s}")
        assert s.others_answered == 30 and s.others_mismatches == 0
        # the class was answered and the slow client's own tables finished while it was far behind
        assert s.read_when_engine_done < s.total_bytes / 2, (s.read_when_engine_done, s.total_bytes)
        assert s.read_when_others_done < s.total_bytes / 2
        assert s.slow_mismatches == 0  # read at last, its 8 answers are still the prompt's alone

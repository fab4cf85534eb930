"""The class kitchen as OpenAI clients and benchmarks really call it: text-part content, no model,
max_completion_tokens, vLLM's ignore_eos and min_tokens, logprobs on both routes (streamed and not),
checked on the real chef through the official `openai` client and raw HTTP; logprobs against
`transformers` on the same weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
import torch
from kitchen_server import kitchen

from serving.caps import Caps

CHEF = Path(__file__).resolve().parent.parent / "engine" / "models" / "chef"


@pytest.fixture(scope="module")
def served():
    with kitchen(Caps(max_order_tokens=4000, max_new_tokens=200, max_order_seconds=60)) as (url, client):
        yield url


@pytest.fixture
def oai(served):
    from openai import OpenAI

    return OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0, timeout=60)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def test_chat_content_as_text_parts_equals_content_as_a_string(oai):
    said = oai.chat.completions.create(model="chef", messages=[{"role": "user", "content": "Who is there?"}],
                                       max_completion_tokens=12, temperature=0)  # fmt: skip
    parts = oai.chat.completions.create(model="chef", max_completion_tokens=12, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Who is "}, {"type": "text", "text": "there?"}]}])  # fmt: skip
    assert parts.choices[0].message.content == said.choices[0].message.content
    assert parts.usage.completion_tokens == said.usage.completion_tokens == 12  # max_completion_tokens honoured


def test_no_model_means_the_one_served(served):
    r = post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["model"] == "chef" and r.json()["usage"]["completion_tokens"] == 3
    r = post(served, "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 3, "stream": True})
    chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
    assert r.status_code == 200 and {c["model"] for c in chunks} == {"chef"}


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "content part of type 'image_url'; this kitchen reads text parts only"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "content must be text or a list"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
         "'top_logprobs' needs 'logprobs': true"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
         "field 'top_logprobs' must be an integer from 0 to 20"),
        ("/v1/completions", {"prompt": "hi", "logprobs": True}, "field 'logprobs' must be an integer from 0 to 20"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "min_tokens": 9}, "'min_tokens' (9) must not exceed"),
        ("/v1/completions", {"prompt": "hi", "ignore_eos": "yes"}, "field 'ignore_eos' must be true or false"),
        ("/v1/completions", {"prompt": "hi", "min_tokens": 20}, "'min_tokens' (20) must not exceed max_tokens (16)"),
    ],
)  # fmt: skip
def test_refusals_stay_one_line(served, path, body, words):
    r = post(served, path, body)
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert words in message and "\n" not in message


# The chef rarely writes EOS; after a farewell and a blank line some sampled answers end early.
EARLY = "ROMEO:\nFarewell.\n\n"


def early_stop(url: str) -> tuple[int, int]:
    """(seed, tokens) of a sampled answer that the chef ends with EOS before 64 tokens (found, not assumed)."""
    for base in range(0, 160, 16):
        r = post(url, "/v1/completions", {"prompt": EARLY, "max_tokens": 64, "temperature": 2.0, "seed": base, "n": 16,
                                          "logprobs": 0})  # fmt: skip
        for c in r.json()["choices"]:
            if c["finish_reason"] == "stop":
                return base + c["index"], len(c["logprobs"]["tokens"])
    pytest.fail("no seed in 0..159 ended early at temperature 2: the chef changed")


def test_ignore_eos_and_min_tokens_as_vllm(served):
    seed, n = early_stop(served)
    body = {"prompt": EARLY, "max_tokens": 64, "temperature": 2.0, "seed": seed, "logprobs": 0}
    stopped = post(served, "/v1/completions", body).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["logprobs"]["tokens"][-1] == ""  # EOS, no text
    on = post(served, "/v1/completions", body | {"ignore_eos": True}).json()["choices"][0]
    assert on["finish_reason"] == "length" and len(on["logprobs"]["tokens"]) == 64
    assert on["text"].startswith(stopped["text"])  # the same draws up to the EOS, then it went on
    floor = min(64, n + 5)
    held = post(served, "/v1/completions", body | {"min_tokens": floor}).json()
    tokens = held["choices"][0]["logprobs"]["tokens"]
    assert held["usage"]["completion_tokens"] >= floor and len(tokens) >= floor
    assert tokens[: n - 1] == stopped["logprobs"]["tokens"][: n - 1]  # EOS masked from token n on only


def reference_logprobs(prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every output position, (len(output), V)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(CHEF, dtype=torch.float32)
    ids = torch.tensor([prompt_ids + output_ids])  # (1, T)
    with torch.inference_mode():
        logits = hf(ids).logits[0, len(prompt_ids) - 1 : -1]  # (len(output), V)
    return torch.log_softmax(logits, dim=-1)


def test_completion_logprobs_are_the_models_own(served, oai):
    from engine import Engine

    out = oai.completions.create(model="chef", prompt="ROMEO:", max_tokens=10, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text and len(lp.tokens) == 10
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    eng = Engine.load("chef")
    prompt_ids = eng.encode("ROMEO:")
    output_ids = eng.generate(["ROMEO:"], max_new_tokens=10).tokens[0]  # the same greedy answer, as ids
    assert [eng.decode([i]) for i in output_ids] == lp.tokens
    ref = reference_logprobs(prompt_ids, output_ids)
    for pos, (given, top) in enumerate(zip(lp.token_logprobs, lp.top_logprobs, strict=True)):
        assert math.isclose(given, float(ref[pos, output_ids[pos]]), abs_tol=1e-3)
        assert len(top) == 3 and max(top.values()) == pytest.approx(given, abs=1e-6)  # greedy took the best
        assert sorted(top.values(), reverse=True) == pytest.approx(ref[pos].topk(3).values.tolist(), abs=1e-3)
    tokens, values, offsets = [], [], []
    for ch in oai.completions.create(model="chef", prompt="ROMEO:", max_tokens=10, temperature=0, logprobs=3, stream=True):
        if ch.choices and ch.choices[0].logprobs is not None:
            tokens += ch.choices[0].logprobs.tokens
            values += ch.choices[0].logprobs.token_logprobs
            offsets += ch.choices[0].logprobs.text_offset
    assert tokens == lp.tokens and offsets == lp.text_offset  # streamed: each chunk carries its own tokens
    assert values == pytest.approx(lp.token_logprobs, abs=1e-4)


def test_chat_logprobs_streamed_equal_whole(oai):
    msgs = [{"role": "user", "content": "Who is there?"}]
    whole = oai.chat.completions.create(model="chef", messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                        top_logprobs=2)  # fmt: skip
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content) == whole.choices[0].message.content and len(content) == 8
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content)
    assert all(t.logprob <= 0 and t.bytes == list(t.token.encode()) for t in content)
    streamed = []
    for ch in oai.chat.completions.create(model="chef", messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                          top_logprobs=2, stream=True):  # fmt: skip
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed += ch.choices[0].logprobs.content
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)  # the prefix cache reuses the prompt
    plain = oai.chat.completions.create(model="chef", messages=msgs, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content

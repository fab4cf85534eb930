"""The apprentice chef (speculative decoding with prompt lookup) on the real engine."""

from __future__ import annotations

import json

import pytest
import torch

from engine import Engine, EngineError
from engine.events import Done
from engine.sampling import SamplingParams
from engine.speculative import SpecCounters, ngram_draft, verify

FAMILIES = ["tiny_llama", "tiny_llama_tied", "tiny_qwen2", "tiny_gpt2"]
COPY = [11, 57, 3, 200, 42, 9, 101, 7, 66, 12] * 4  # an order that repeats itself: drafts to find


@pytest.fixture(params=FAMILIES)
def tiny(request):
    return request.getfixturevalue(request.param)


def run_all(eng: Engine, orders: list[tuple[list[int], dict]]):
    ids = [eng.submit(p, **s) for p, s in orders]
    results = {}
    while not eng.idle:
        results |= {e.request_id: e.result for e in eng.step() if isinstance(e, Done)}
    return [results[i] for i in ids]


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_greedy_speculation_is_token_identical_to_plain_decoding(tiny, k, policy):
    eng = Engine.load(str(tiny.path), policy=policy, token_budget=24)
    orders = [(COPY, {"max_new_tokens": 30, "stop_at_eos": False}), ([5, 6, 7, 5, 6, 7, 5, 6], {"max_new_tokens": 20})]
    plain = run_all(eng, orders)
    spec = run_all(eng, [(p, s | {"speculate": k}) for p, s in orders] + [([9, 8, 7], {"max_new_tokens": 12})])
    for a, b in zip(plain, spec, strict=False):
        assert b.tokens == a.tokens and len(b.tokens) == len(a.tokens)
    c = spec[0].speculation
    assert c.drafts > 0 and 0 <= c.accepted <= c.drafted <= k * c.drafts
    assert c.accepted_at == sorted(c.accepted_at, reverse=True) and sum(c.accepted_at) == c.accepted
    assert c.mean_acceptance_length == pytest.approx(1 + c.accepted / c.drafts)
    assert spec[2].speculation is None  # a neighbour that does not speculate


def test_the_chef_copies_a_quote_in_fewer_steps_with_the_same_text():
    eng = Engine.load("chef")
    quote = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\nBut soft, what light through yonder"
    (plain,) = run_all(eng, [(quote, {"max_new_tokens": 40})])
    ids = eng.submit(quote, 40, speculate=4)
    steps, result = 0, None
    while not eng.idle:
        steps += 1
        result = next((e.result for e in eng.step() if isinstance(e, Done) and e.request_id == ids), result)
    assert result.text == plain.text and steps < 40 and result.speculation.accepted > 0


def test_a_sampled_draft_check_keeps_the_targets_distribution():
    """Leviathan et al.: the first token out is distributed as the target's p, draft or no draft."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=1.0)
    p = logits[0].softmax(-1)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(6000):
        counts[verify(logits, [1], params, gen)[0]] += 1
    assert torch.allclose(counts / counts.sum(), p, atol=0.02)
    assert verify(logits, [0], SamplingParams(), gen) == [0, 0]  # greedy: accept, then the bonus argmax
    assert verify(logits, [3], SamplingParams(), gen) == [0]  # greedy: rejected, the target's own token


def test_seeded_sampled_speculation_is_repeatable_and_differs_by_seed(tiny_llama):
    eng = Engine.load(str(tiny_llama.path))
    settings = {"max_new_tokens": 20, "temperature": 0.8, "speculate": 3, "stop_at_eos": False}
    a = run_all(eng, [(COPY, settings | {"seed": 1}), ([1, 2, 3], {"max_new_tokens": 5})])[0]
    b = run_all(eng, [(COPY, settings | {"seed": 1})])[0]
    c = run_all(eng, [(COPY, settings | {"seed": 2})])[0]
    assert a.tokens == b.tokens and a.tokens != c.tokens and len(a.tokens) == 20


def test_prompt_lookup_finds_the_most_recent_match():
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3], 2) == [8, 1]
    assert ngram_draft([1, 2, 3, 4], 3) == []
    assert ngram_draft([5, 6, 5], 4) == [6, 5]
    counters = SpecCounters()
    counters.record(4, 2)
    counters.record(3, 3)
    assert counters.accepted_at == [2, 2, 1, 0] and counters.mean_acceptance_length == 3.5


@pytest.mark.parametrize(
    "settings, pattern",
    [({"speculate": -1}, "speculate must be 0..16"), ({"speculate": 99}, "speculate must be 0..16"),
     ({"speculate": 2, "draft": "apprentice"}, "draft 'apprentice' is not available")],  # fmt: skip
)
def test_bad_speculation_settings_are_refused_in_one_line(tiny_llama, settings, pattern):
    eng = Engine.load(str(tiny_llama.path))
    with pytest.raises(EngineError, match=pattern):
        eng.submit(COPY, 8, **settings)
    with pytest.raises(EngineError, match="runs on the serving path"):
        eng.generate([COPY], max_new_tokens=8, speculate=2)


def test_cli_generate_speculates_through_the_serving_path(tiny_llama, capsys):
    from engine.cli import main

    args = ["generate", "--model", str(tiny_llama.path), "--prompt-ids", ",".join(map(str, COPY)),
            "--max-new-tokens", "16", "--ignore-eos", "--json"]  # fmt: skip
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--speculate", "4", "--draft", "ngram"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["tokens"] == plain["tokens"]
    assert spec["speculation"]["drafts"] > 0 and spec["speculation"]["mean_acceptance_length"] >= 1
    assert main([*args, "--speculate", "4", "--batch", "2"]) == 2
    assert "one prompt" in capsys.readouterr().err

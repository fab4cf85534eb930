"""The apprentice chef (speculative decoding: prompt lookup and draft models) on the real engine."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine import Engine, EngineError
from engine.events import Done
from engine.sampling import SamplingParams
from engine.speculative import SpecCounters, ngram_draft, verify

QUOTE = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\nBut soft, what light through yonder"

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
    quote = QUOTE
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


@pytest.mark.parametrize("draft", ["ngram", "self"])
def test_seeded_sampled_speculation_is_repeatable_and_differs_by_seed(tiny_llama, draft):
    eng = Engine.load(str(tiny_llama.path))
    draft = str(tiny_llama.path) if draft == "self" else draft
    settings = {"max_new_tokens": 20, "temperature": 0.8, "speculate": 3, "stop_at_eos": False, "draft": draft}
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
    assert counters.rejected == 1 and counters.acceptance_rate == 5 / 6  # 5 accepts, 1 reject
    both = SpecCounters(accepted_at=[1])
    both.add(counters)
    assert (both.drafts, both.accepted, both.rejected, both.accepted_at) == (2, 5, 1, [3, 2, 1, 0])


@pytest.mark.parametrize(
    "settings, pattern",
    [({"speculate": -1}, "speculate must be 0..16"), ({"speculate": 99}, "speculate must be 0..16"),
     ({"speculate": 2, "draft": "apprentice"}, "draft 'apprentice' has a vocabulary of 2,048 ids; the model's is 320"),
     ({"speculate": 2, "draft": ""}, "draft must be 'ngram'")],  # fmt: skip
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


# -- draft models: a second model with its own KV seats (engine/draft.py) --------------------------------


@pytest.fixture
def draft_of(tiny, tmp_path_factory):
    """Another random model of the same family and vocabulary (one layer deep where the helper allows):
    a weak draft that the target mostly rejects."""
    from conftest import make_tiny_model

    depth = {} if tiny.family == "gpt2" else {"num_hidden_layers": 1}  # the GPT-2 helper fixes n_layer
    return make_tiny_model(tmp_path_factory.mktemp(f"draft_{tiny.family}"), tiny.family, seed=11, **depth)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_draft_model_is_token_identical_to_plain_decoding(tiny, draft_of, k):
    """Every family, several k; three orders speculate together (their draft steps share passes)."""
    eng = Engine.load(str(tiny.path), policy="chunked", token_budget=32)
    orders = [(COPY, {"max_new_tokens": 24, "stop_at_eos": False}), ([5, 6, 7, 8], {"max_new_tokens": 17}),
              (list(range(100, 130)), {"max_new_tokens": 9, "stop_at_eos": False})]  # fmt: skip
    plain = run_all(eng, orders)
    neighbours = [([9, 8, 7], {"max_new_tokens": 12}), (COPY, {"max_new_tokens": 10, "speculate": 2})]  # plain, lookup
    for draft in (str(draft_of.path), str(tiny.path)):  # a weak draft; the target itself (agrees always)
        spec = run_all(eng, [(p, s | {"speculate": k, "draft": draft}) for p, s in orders] + neighbours)
        assert spec[3].speculation is None and spec[4].speculation is not None
        for a, b in zip(plain, spec[:3], strict=True):
            assert b.tokens == a.tokens
            c = b.speculation
            assert c.drafts > 0 and 0 <= c.accepted <= c.drafted <= k * c.drafts
            assert sum(c.accepted_at) == c.accepted
    self_draft = spec[0].speculation  # the target drafting for itself: every draft accepted
    assert self_draft.accepted == self_draft.drafted and self_draft.drafts < 24


def test_the_apprentice_drafts_for_the_chef_with_identical_text():
    eng = Engine.load("chef")
    (plain,) = run_all(eng, [(QUOTE, {"max_new_tokens": 48, "stop_at_eos": False})])
    (spec,) = run_all(eng, [(QUOTE, {"max_new_tokens": 48, "stop_at_eos": False, "speculate": 3,
                                     "draft": "apprentice"})])  # fmt: skip
    c = spec.speculation
    assert spec.tokens == plain.tokens and c.drafts > 0 and c.accepted > 0
    assert c.mean_acceptance_length == pytest.approx(1 + c.accepted / c.drafts)
    apprentice = eng.serving.drafter.models["apprentice"]
    assert apprentice.cost.passes >= c.drafts and apprentice.cost.seconds > 0


def test_draft_seats_follow_the_targets_sequences(tiny_llama):
    """A cancelled or finished sequence gives its draft seat back; a rejected draft rolls back."""
    eng = Engine.load(str(tiny_llama.path), max_seqs=3)
    draft = {"speculate": 4, "draft": str(tiny_llama.path), "stop_at_eos": False}
    a = eng.submit(COPY, 30, **draft)
    eng.submit([1, 2, 3], 30, **draft)
    for _ in range(3):
        eng.step()
    model = eng.serving.drafter.models[str(tiny_llama.path)]
    assert len(model.shadows) == 2
    eng.cancel(a)
    eng.step()
    eng.step()
    assert list(model.shadows) == [1] and model.pool.free_seats == 2
    while not eng.idle:
        eng.step()
    eng.submit([9, 9], 4, **draft)
    while not eng.idle:
        eng.step()
    assert list(model.shadows) == [2]


def test_a_draft_with_another_tokenizer_is_refused(tiny_llama_tok, tmp_path):
    """Same vocabulary size, two tokens swapped: the draft would propose the wrong words."""
    shutil.copytree(tiny_llama_tok.path, tmp_path / "draft")
    tok = json.loads((tmp_path / "draft" / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    x, y = sorted(vocab)[-2:]
    vocab[x], vocab[y] = vocab[y], vocab[x]
    (tmp_path / "draft" / "tokenizer.json").write_text(json.dumps(tok))
    eng = Engine.load(str(tiny_llama_tok.path))
    with pytest.raises(EngineError, match="another tokenizer than the model"):
        eng.submit([1, 2, 3], 4, speculate=2, draft=str(tmp_path / "draft"))


def test_cli_generate_with_the_apprentice_reports_its_counters(capsys):
    from engine.cli import main

    args = ["generate", "--model", "chef", "--prompt", "ROMEO:", "--max-new-tokens", "12", "--ignore-eos", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--speculate", "3", "--draft", "apprentice"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["tokens"] == plain["tokens"]
    s = spec["speculation"]
    assert s["drafts"] > 0 and len(s["accepted_at"]) == 3 and s["mean_acceptance_length"] == 1 + s["accepted"] / s["drafts"]


def test_a_preempted_sequence_drafts_again_from_scratch_with_the_same_text(tiny_llama):
    """KV memory for 70 tokens, three orders wanting 30-40 each: the newest is preempted and recomputed;
    its draft seat is freed with it and rebuilt when it runs again."""
    orders = [(list(range(10 + i, 20 + i)), {"max_new_tokens": 24, "stop_at_eos": False}) for i in range(3)]
    plain = run_all(Engine.load(str(tiny_llama.path)), orders)
    eng = Engine.load(str(tiny_llama.path), kv_tokens=70)
    ids = [eng.submit(p, **s, speculate=3, draft=str(tiny_llama.path)) for p, s in orders]
    results, preempted = {}, 0
    while not eng.idle:
        for e in eng.step():
            preempted += len(getattr(e, "preempted", ()))
            if isinstance(e, Done):
                results[e.request_id] = e.result
    assert preempted > 0
    assert [results[i].tokens for i in ids] == [r.tokens for r in plain]


def test_a_draft_whose_kv_seats_do_not_fit_is_refused_in_one_line(tiny_llama, monkeypatch):
    """The draft's seats (max_seqs x its context x its bytes per token) must fit in half the free memory;
    the machine is made to report 1 MB free (the one thing not real here)."""
    import engine.draft

    monkeypatch.setattr(engine.draft, "available_memory", lambda device: 1_000_000)
    eng = Engine.load(str(tiny_llama.path), max_seqs=64)
    with pytest.raises(EngineError, match=r"draft '.*' needs 4,194,304 bytes of KV seats \(64 x its context\)"):
        eng.submit(COPY, 4, speculate=2, draft=str(tiny_llama.path))

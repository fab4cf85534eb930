"""The engine's per-request extras on the serving path: logprobs (also through speculative decoding's
verified drafts) and min_tokens; a fixed-batch order refuses them in one line."""

from __future__ import annotations

import pytest

from engine import Engine, EngineError
from engine.events import Token


def served(eng: Engine, prompt: str, n: int, **settings) -> list[Token]:
    rid = eng.submit(prompt, n, **settings)
    tokens = []
    while not eng.idle:
        tokens += [ev for ev in eng.step() if isinstance(ev, Token) and ev.request_id == rid]
    return tokens


def test_logprobs_are_the_same_with_and_without_speculation():
    eng = Engine.load("chef", policy="chunked")
    plain = served(eng, "ROMEO:\nROMEO:\nROMEO:", 24, logprobs=2)
    drafted = served(eng, "ROMEO:\nROMEO:\nROMEO:", 24, logprobs=2, speculate=3)
    assert [t.token_id for t in drafted] == [t.token_id for t in plain]
    assert [t.logprob for t in drafted] == pytest.approx([t.logprob for t in plain], abs=1e-4)
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0][0] == t.token_id for t in plain)  # greedy: the best
    assert all(t.logprob is None and t.top_logprobs == () for t in served(eng, "ROMEO:", 4))  # not asked, not paid


# The chef rarely writes EOS; after a farewell and a blank line some sampled answers end early.
EARLY = "ROMEO:\nFarewell.\n\n"


def test_min_tokens_and_the_fixed_batch_refusal():
    eng = Engine.load("chef", policy="chunked")
    for seed in range(64):  # a sampled answer the chef ends with EOS early (found, not assumed)
        ended = served(eng, EARLY, 64, temperature=2.0, seed=seed)
        if len(ended) < 60:
            break
    else:
        pytest.fail("no seed in 0..63 ended early at temperature 2")
    held = served(eng, EARLY, 64, temperature=2.0, seed=seed, min_tokens=len(ended) + 3)
    assert len(held) >= len(ended) + 3 and [t.token_id for t in held[: len(ended) - 1]] == [t.token_id for t in ended[:-1]]
    with pytest.raises(EngineError, match="logprobs and min_tokens run on the serving path"):
        eng.generate(["ROMEO:"], 4, logprobs=1)
    with pytest.raises(EngineError, match=r"min_tokens must be 0..max_new_tokens \(4\)"):
        eng.submit("ROMEO:", 4, min_tokens=5)

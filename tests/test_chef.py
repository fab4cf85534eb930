"""The shipped chef and apprentice: standard HF folders, the engine agrees with transformers, quality bar.

Everything here runs on the committed weights in engine/models/, so a test failure means the shipped
model (or the engine reading it) is wrong, not a freshly trained one.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
CHEF = REPO / "engine" / "models" / "chef"
APPRENTICE = REPO / "engine" / "models" / "apprentice"
CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
HF_FILES = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
]


def _train_script():
    """The training script's own corpus split, baseline and evaluation: the test measures the same way.

    The script imports its neighbours (`chef_corpus`, `chef_card`) as `python scripts/train_chef.py`
    does: from its own folder."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("train_chef", REPO / "scripts" / "train_chef.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hf_chef():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(str(CHEF)).eval(), AutoTokenizer.from_pretrained(str(CHEF))


@pytest.mark.parametrize("folder", [CHEF, APPRENTICE], ids=["chef", "apprentice"])
def test_folder_is_a_standard_hf_checkpoint_under_30_mb(folder):
    for name in HF_FILES:
        assert (folder / name).is_file(), f"{folder.name} lacks {name}"
    cfg = json.loads((folder / "config.json").read_text())
    card = json.loads((folder / "training.json").read_text())["report"]
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["max_position_embeddings"] == card["context"]
    total = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    assert total <= 30 * 2**20
    assert (folder / "README.md").is_file() and (folder / "training_curve.png").is_file()


def test_the_chef_reads_prompts_of_2048_tokens_and_writes_no_worse_than_the_512_token_chef():
    """The kitchen needs prompts long enough for the wok to win on a small CPU: 2,048 tokens and a
    reply. The longer context was trained on, not just declared: the card's own evaluation shows the
    loss at the old 512-token windows no worse than the chef it continued from, and level past 512."""
    from engine import Engine

    card = json.loads((CHEF / "training.json").read_text())["report"]
    assert card["context"] >= 2048 + 64 and Engine.load("chef").info.max_context == card["context"]
    assert card["val_short_nats_per_token"] <= card["init_val_short_nats_per_token"]
    bands = {b["start"]: b["nats_per_token"] for b in card["val_bands"]}
    assert max(bands.values()) < card["init_val_short_nats_per_token"] + 0.05, bands  # sane past position 512
    assert card["init_val_long_nats_per_token"] > card["val_nats_per_token"] + 0.5  # the old chef could not


def test_apprentice_shares_the_tokenizer_and_is_much_smaller():
    assert (APPRENTICE / "tokenizer.json").read_bytes() == (CHEF / "tokenizer.json").read_bytes()
    chef, app = (json.loads((f / "config.json").read_text()) for f in (CHEF, APPRENTICE))
    assert (app["vocab_size"], app["eos_token_id"]) == (chef["vocab_size"], chef["eos_token_id"])
    sizes = [(f / "model.safetensors").stat().st_size for f in (CHEF, APPRENTICE)]
    assert sizes[1] * 4 < sizes[0]


@pytest.mark.parametrize(
    "text",
    [
        "ROMEO:\nBut, soft! what light through yonder window breaks?\n\n",
        "  leading spaces, tabs\tand trailing  ",
        "naïve café — 東京 🍲 <|endoftext|> is just text here? no: it is the EOS token",
        "",
    ],
)
def test_tokenizer_round_trips_text(hf_chef, text):
    _, tok = hf_chef
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")


def _hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    """Plain greedy decoding by recomputing the whole sequence each step (no cache: slow but obvious)."""
    seq = torch.tensor([ids])  # (1, T)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(input_ids=seq).logits[0, -1].argmax())
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)  # (1, T+1)
    return out


def test_engine_and_transformers_agree_on_50_greedy_tokens(hf_chef):
    from engine import Engine

    model, tok = hf_chef
    prompt = "ROMEO:\nWhat say you, my lord?\n"
    eng = Engine.load(str(CHEF), device="cpu", dtype="float32")
    assert eng.encode(prompt) == tok.encode(prompt, add_special_tokens=False)
    res = eng.generate([prompt], max_new_tokens=50, temperature=0.0, stop_at_eos=False)
    assert res.tokens[0] == _hf_greedy(model, tok.encode(prompt, add_special_tokens=False), 50)


def test_engine_loads_the_chef_by_catalog_name(hf_chef):
    """`Engine.load("chef")` goes through the catalog to the same folder, and counts the same parameters."""
    from engine import Engine
    from serving.catalog import describe, load_catalog

    model, _ = hf_chef
    eng = Engine.load("chef", device="cpu", dtype="float32")
    n_params = sum(p.numel() for p in model.parameters())
    assert eng.info.trained and eng.info.n_params == n_params
    assert describe(load_catalog().get("chef")).n_params == n_params


needs_corpus = pytest.mark.skipif(not CORPUS.is_file(), reason=f"corpus not at {CORPUS}")


def measured_val_loss(folder: Path, tc):
    """Validation loss of a shipped folder, measured now from its weights, plus the baseline."""
    from transformers import AutoModelForCausalLM

    split = tc.read_corpus(CORPUS)
    tok = tc.load_tokenizer(folder)
    val_ids = torch.tensor(tok.encode(split.val_text).ids)
    chars = len(split.val_text) - len(tok.decode(val_ids[:1].tolist()))
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    context = json.loads((folder / "training.json").read_text())["report"]["context"]
    return tc.evaluate(model, val_ids, chars, context=context), tc.char_unigram_nats(split)


@needs_corpus
def test_validation_loss_per_char_is_clearly_below_the_char_unigram_baseline(capsys):
    """Recompute the model cards' numbers from the shipped weights; they must match and beat the baseline."""
    tc = _train_script()
    torch.set_num_threads(1)
    losses = {}
    for folder in (CHEF, APPRENTICE):
        loss, baseline = measured_val_loss(folder, tc)
        losses[folder.name] = loss.nats_per_char
        with capsys.disabled():
            print(
                f"\n{folder.name} val: {loss.nats_per_token:.3f} nats/token, {loss.nats_per_char:.3f} nats/char; "
                f"char-unigram baseline {baseline:.3f} nats/char"
            )
        card = json.loads((folder / "training.json").read_text())["report"]
        assert abs(card["val_nats_per_char"] - loss.nats_per_char) < 0.01
        assert abs(card["char_unigram_nats_per_char"] - baseline) < 1e-9
        assert loss.nats_per_char < baseline
    assert 3.3 < baseline < 3.45  # the unigram entropy of English-like text in nats, sanity
    # "Clearly below": under half the baseline. The 4-minute throwaway chef (1.89 nats/char) would fail.
    assert losses["chef"] < 0.5 * baseline
    # Not asserted: chef < apprentice. Measured, the 7-minute apprentice (1.567 nats/char, 512-token
    # windows) edges out the chef (1.571 on its 2,560-token windows); see the chef's model card.


def word_stats(sample: str, vocabulary: set[str]) -> tuple[int, float]:
    """(number of words, fraction found in the training split's vocabulary)."""
    words = [w.lower() for w in re.findall(r"[A-Za-z']+", sample)]
    words = [w.strip("'") for w in words if w.strip("'")]
    known = sum(w in vocabulary for w in words)
    return len(words), known / max(1, len(words))


SAMPLE_SEEDS = range(1337, 1347)


@needs_corpus
def test_seeded_samples_are_printable_words_with_line_structure(capsys):
    """Sampled continuations of `ROMEO:` through the engine (temperature 0.8, top-k 40, ten seeds).

    "Dictionary-like" is judged against the words of the training split: no dictionary ships with
    this machine, and Shakespeare's own spellings ("thou", "'tis") should count as words. Pooled over
    ten samples, because one ~70-word sample varies a lot by seed: measured, 84-99 % known words for
    the 512-token chef and 81-99 % for the 2,560-token one (pooled 93.7 % and 91.3 %).
    """
    from engine import Engine

    tc = _train_script()
    vocabulary = {w.lower().strip("'") for w in re.findall(r"[A-Za-z']+", tc.read_corpus(CORPUS).train_text)}
    eng = Engine.load(str(CHEF), device="cpu", dtype="float32")
    words = known = 0
    for seed in SAMPLE_SEEDS:
        res = eng.generate(["ROMEO:"], max_new_tokens=120, temperature=0.8, top_k=40, seed=seed, stop_at_eos=False)
        sample = "ROMEO:" + res.texts[0]
        n_words, share = word_stats(sample, vocabulary)
        lines = [ln for ln in sample.splitlines() if ln.strip()]
        assert all(c.isprintable() or c in "\n\t" for c in sample)
        assert n_words >= 30 and share >= 0.75, (seed, share, sample)
        assert len(lines) >= 4 and max(len(ln) for ln in lines) < 200
        words, known = words + n_words, known + n_words * share
    with capsys.disabled():
        print(f"\n--- chef samples: {words} words, {known / words:.1%} known; the last one ---\n{sample}\n---")
    assert known / words >= 0.85
    # The model card's sample passes the single-sample bar and is the one the card shows.
    card_sample = json.loads((CHEF / "training.json").read_text())["report"]["sample"]
    assert word_stats(card_sample, vocabulary)[1] >= 0.75 and card_sample in (CHEF / "README.md").read_text()

"""The chef's training text and tokenizer: Tiny Shakespeare, checked, split, and turned into tokens.

Why a file of its own: the training script, the tests and any later run (a fresh chef, a longer
context) must read the corpus and measure the baseline the same way, or their numbers do not compare.

- `read_corpus` refuses any file but the one the model cards describe (sha256), then splits it: the
  first 95 % trains, the last 5 % validates.
- `char_unigram_nats` is the baseline every model card quotes: the validation split's cross-entropy
  under the training split's character frequencies, in nats per character.
- The tokenizer is a small byte-level BPE learned on the training split only (any text encodes, no
  UNK), saved as an ordinary Hugging Face fast tokenizer.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
EOS = "<|endoftext|>"
VAL_FRACTION = 0.05


@dataclass(frozen=True)
class Split:
    train_text: str
    val_text: str


def read_corpus(path: Path) -> Split:
    """Read the corpus, refuse a different file than the one the model card describes, split 95/5."""
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != CORPUS_SHA256:
        sys.exit(f"{path}: sha256 {digest[:12]}… is not the Tiny Shakespeare file ({CORPUS_SHA256[:12]}…)")
    text = raw.decode("utf-8")
    cut = int(len(text) * (1 - VAL_FRACTION))
    return Split(train_text=text[:cut], val_text=text[cut:])


def char_unigram_nats(split: Split) -> float:
    """Cross-entropy (nats/char) of the validation split under the training split's char frequencies.

    Add-one smoothing so a character unseen in training costs a finite amount.
    Worked example: train "aab", val "ab": p(a)=3/6, p(b)=2/6, p(other)=1/6 -> mean(-ln .5, -ln .33).
    """
    counts = Counter(split.train_text)
    alphabet = set(counts) | set(split.val_text)
    total = sum(counts.values()) + len(alphabet)
    nll = sum(-math.log((counts[c] + 1) / total) for c in split.val_text)
    return nll / len(split.val_text)


def train_tokenizer(train_text: str, vocab_size: int):
    """A byte-level BPE (GPT-2 style) learned on the training split only: any text encodes, no UNK."""
    from tokenizers import (  # lazy: tokenizers' trainer only when a tokenizer is trained
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    chunks = [train_text[i : i + 20_000] for i in range(0, len(train_text), 20_000)]
    tok.train_from_iterator(chunks, trainer=trainer)
    return tok


def save_tokenizer(tok, out: Path, max_len: int) -> None:
    """Save as a standard HF fast tokenizer (tokenizer.json + tokenizer_config.json)."""
    from transformers import (
        PreTrainedTokenizerFast,  # lazy: transformers is heavy; only when the tokenizer is saved
    )

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS, model_max_length=max_len
    )
    fast.save_pretrained(str(out))


def load_tokenizer(folder: Path):
    from tokenizers import Tokenizer  # lazy: only when a tokenizer is loaded

    return Tokenizer.from_file(str(folder / "tokenizer.json"))

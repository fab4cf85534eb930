"""Train the kitchen's own models (the chef and its apprentice) on Tiny Shakespeare, on a CPU.

Why train our own: a fresh machine has no model hub, yet the app must open on a real model that
writes real text. We train a small Llama here and save it as an ordinary Hugging Face folder
(`config.json`, `model.safetensors`, `tokenizer.json`, ...), so the engine loads it exactly like a
hub checkpoint: nothing about it is special-cased.

What happens, top to bottom:
  1. read the corpus, check its sha256, split it: the first 95 % trains, the last 5 % validates;
  2. train a small byte-level BPE tokenizer on the training split only (or reuse the chef's, for
     the apprentice, so the two can take part in speculative decoding);
  3. train `transformers.LlamaForCausalLM` with AdamW on random 512-token windows, evaluating the
     validation loss every `--eval-every` steps and keeping the best weights;
  4. write the HF folder, the training curve (PNG) and a model card (README.md) with the exact
     command, the machine, the time, the size and both validation losses (per token and per char).

Per-character loss lets models with different tokenizers compare: a token covers ~3 characters
here, so 4.5 nats/token is ~1.5 nats/char. The baseline is a character-unigram model (each char's
training-split frequency): its cross-entropy on the validation split, in nats/char.

Examples (the model cards record the exact command of each shipped run):
    .venv/bin/python scripts/train_chef.py --data ../shared/data/tinyshakespeare.txt \\
        --size chef --out assets/models/chef --steps 2400 --minutes 30
    .venv/bin/python scripts/train_chef.py --data ../shared/data/tinyshakespeare.txt \\
        --size apprentice --tokenizer-from assets/models/chef --out assets/models/apprentice --minutes 7
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
EOS = "<|endoftext|>"
VAL_FRACTION = 0.05


@dataclass(frozen=True)
class Shape:
    """A Llama shape small enough to train on one CPU core within the hour."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


# The chef is ~5 M params (20 MB fp32); the apprentice is ~10x cheaper per token.
# Both use grouped-query attention (fewer KV heads than query heads), like the real Llamas.
SHAPES = {
    "chef": Shape(256, 704, 6, 8, 4),
    "apprentice": Shape(128, 352, 2, 4, 2),
}


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
    from collections import Counter

    counts = Counter(split.train_text)
    alphabet = set(counts) | set(split.val_text)
    total = sum(counts.values()) + len(alphabet)
    nll = sum(-math.log((counts[c] + 1) / total) for c in split.val_text)
    return nll / len(split.val_text)


def train_tokenizer(train_text: str, vocab_size: int):
    """A byte-level BPE (GPT-2 style) learned on the training split only: any text encodes, no UNK."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

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
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS, model_max_length=max_len
    )
    fast.save_pretrained(str(out))


def load_tokenizer(folder: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def build_model(shape: Shape, vocab_size: int, eos_id: int, context: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=context,
        rope_theta=10_000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        rms_norm_eps=1e-5,
        **asdict(shape),
    )
    return LlamaForCausalLM(cfg)


@dataclass(frozen=True)
class ValLoss:
    nats_per_token: float
    nats_per_char: float
    tokens: int
    chars: int


@torch.no_grad()
def evaluate(model, val_ids: torch.Tensor, chars_predicted: int, context: int, batch: int = 8) -> ValLoss:
    """Total NLL of every validation token but the first, in windows of `context` (no overlap).

    Each window predicts `context` tokens from the ones before it; consecutive windows share one
    token so every token after the first is predicted exactly once.
    """
    model.eval()
    n = val_ids.numel() - 1
    starts = list(range(0, n, context))
    total = 0.0
    for i in range(0, len(starts), batch):
        for s in starts[i : i + batch]:  # ragged last window: run one at a time, it is cheap
            window = val_ids[s : s + context + 1]
            x, y = window[:-1].unsqueeze(0), window[1:].unsqueeze(0)  # (1, T)
            logits = model(input_ids=x).logits  # (1, T, V)
            total += torch.nn.functional.cross_entropy(logits[0], y[0], reduction="sum").item()
    model.train()
    return ValLoss(total / n, total / chars_predicted, n, chars_predicted)


def add_residual_dropout(model, p: float) -> None:
    """Dropout on each attention and MLP output before it joins the residual stream (training only).

    Why it exists: the corpus is ~370 k tokens and a long run makes many passes over it. Why it is off
    by default: at our CPU budget it made no measurable difference (at step 800, 1.607 nats/char with
    dropout 0.1 and LR 2e-3 vs 1.604 without it at LR 3e-3), so it only adds a knob. Hooks keep the saved
    checkpoint a plain LlamaForCausalLM: `eval()` turns the dropout off, and hooks are not saved.
    """
    if p <= 0:
        return

    def drop(module, inputs, output):
        if isinstance(output, tuple):  # attention returns (hidden, weights)
            return (torch.nn.functional.dropout(output[0], p, module.training), *output[1:])
        return torch.nn.functional.dropout(output, p, module.training)

    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(drop)
        layer.mlp.register_forward_hook(drop)


def random_batch(ids: torch.Tensor, batch: int, context: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` random windows of context+1 tokens (inputs and shifted labels come from the same row)."""
    starts = torch.randint(0, ids.numel() - context - 1, (batch,), generator=gen)
    return torch.stack([ids[s : s + context + 1] for s in starts.tolist()])  # (B, T+1)


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to 10 % of the peak as progress reaches 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def run_progress(step: int, steps: int, elapsed_s: float, budget_s: float) -> float:
    """How far through the run we are: steps or wall-clock, whichever runs out first.

    Why both: this CPU is shared, so a step can take 1.5 s or 4 s. Following the clock as well means
    a slow day still ends on a fully decayed learning rate inside the budget instead of being cut
    off at a high one. On an idle machine the steps bind and the run is repeatable step for step.
    Example: step 500 of 2,000 after 30 of 45 minutes -> progress max(0.25, 0.67) = 0.67.
    """
    return max(step / steps, elapsed_s / budget_s)


def sample_text(model, tok, prompt: str, n: int, seed: int, temperature: float = 0.8) -> str:
    """A seeded sample (temperature 0.8, top-k 40) through HF generate, for the model card."""
    ids = torch.tensor([tok.encode(prompt).ids])
    torch.manual_seed(seed)
    out = model.generate(ids, max_new_tokens=n, do_sample=True, temperature=temperature, top_k=40)
    return tok.decode(out[0].tolist())


def plot_curve(history: list[dict], baseline: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    tr = [h for h in history if "train_nats_per_char" in h]
    va = [h for h in history if "val_nats_per_char" in h]
    ax.plot([h["step"] for h in tr], [h["train_nats_per_char"] for h in tr], label="train (batch)", alpha=0.6)
    ax.plot([h["step"] for h in va], [h["val_nats_per_char"] for h in va], "o-", label="validation")
    ax.axhline(baseline, color="gray", ls="--", label=f"char-unigram baseline {baseline:.2f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss, nats per character")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="path to tinyshakespeare.txt")
    p.add_argument("--out", type=Path, required=True, help="output HF folder")
    p.add_argument("--size", choices=sorted(SHAPES), default="chef")
    p.add_argument("--tokenizer-from", type=Path, default=None, help="reuse this folder's tokenizer.json")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument(
        "--minutes",
        type=float,
        default=45.0,
        help="wall-clock budget: the LR decays by it and the run stops at it",
    )
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.0, help="residual dropout while training")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = "python scripts/train_chef.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    split = read_corpus(args.data)
    baseline = char_unigram_nats(split)
    if args.tokenizer_from:
        tok = load_tokenizer(args.tokenizer_from)
    else:
        tok = train_tokenizer(split.train_text, args.vocab)
    save_tokenizer(tok, args.out, args.context)
    eos_id = tok.token_to_id(EOS)
    train_ids = torch.tensor(tok.encode(split.train_text).ids, dtype=torch.long)
    val_ids = torch.tensor(tok.encode(split.val_text).ids, dtype=torch.long)
    val_chars = len(split.val_text) - len(tok.decode(val_ids[:1].tolist()))
    print(
        f"corpus: {len(split.train_text):,} train chars -> {train_ids.numel():,} tokens; "
        f"{len(split.val_text):,} val chars -> {val_ids.numel():,} tokens; baseline {baseline:.3f} nats/char",
        flush=True,
    )

    model = build_model(SHAPES[args.size], tok.get_vocab_size(), eos_id, args.context, args.seed)
    add_residual_dropout(model, args.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {args.size}: {n_params:,} params, threads {args.threads}", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    chars_per_token = len(split.train_text) / train_ids.numel()

    history: list[dict] = []
    best: ValLoss | None = None
    best_step = 0
    t0 = time.perf_counter()
    step = 0
    stopped_by_clock = False
    budget_s = args.minutes * 60
    for step in range(1, args.steps + 1):
        progress = run_progress(step - 1, args.steps, time.perf_counter() - t0, budget_s)
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, progress, args.lr, args.warmup)
        rows = random_batch(train_ids, args.batch, args.context, gen)  # (B, T+1)
        logits = model(input_ids=rows[:, :-1]).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - t0
        history.append({"step": step, "t": elapsed, "train_nats_per_char": loss.item() / chars_per_token})
        out_of_time = elapsed > budget_s
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            v = evaluate(model, val_ids, val_chars, args.context)
            history.append(
                {
                    "step": step,
                    "t": elapsed,
                    "val_nats_per_token": v.nats_per_token,
                    "val_nats_per_char": v.nats_per_char,
                }
            )
            print(
                f"step {step} {elapsed:.0f}s train {loss.item():.3f}/tok val {v.nats_per_token:.3f}/tok "
                f"{v.nats_per_char:.3f}/char",
                flush=True,
            )
            if best is None or v.nats_per_token < best.nats_per_token:
                best, best_step = v, step
                model.save_pretrained(str(args.out), safe_serialization=True)
        if out_of_time:
            stopped_by_clock = True
            break
    train_s = time.perf_counter() - t0

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(args.out))  # the best checkpoint, as shipped
    sample = sample_text(model, tok, "ROMEO:", 120, args.seed)
    report = {
        "size": args.size,
        "shape": asdict(SHAPES[args.size]),
        "n_params": n_params,
        "vocab_size": tok.get_vocab_size(),
        "context": args.context,
        "steps_run": step,
        "steps_planned": args.steps,
        "stopped_by_clock": stopped_by_clock,
        "best_step": best_step,
        "train_seconds": round(train_s, 1),
        "threads": args.threads,
        "dropout": args.dropout,
        "lr": args.lr,
        "seed": args.seed,
        "val_nats_per_token": best.nats_per_token,
        "val_nats_per_char": best.nats_per_char,
        "val_tokens": best.tokens,
        "val_chars": best.chars,
        "char_unigram_nats_per_char": baseline,
        "train_tokens": int(train_ids.numel()),
        "tokens_seen": step * args.batch * args.context,
        "command": command,
        "machine": machine_description(),
        "sample_prompt": "ROMEO:",
        "sample": sample,
        "weights_bytes": (args.out / "model.safetensors").stat().st_size,
    }
    (args.out / "training.json").write_text(json.dumps({"report": report, "history": history}, indent=1))
    plot_curve(
        history, baseline, args.out / "training_curve.png", f"{args.size}: {n_params / 1e6:.2f} M params"
    )
    (args.out / "README.md").write_text(model_card(report))
    print(json.dumps(report, indent=1), flush=True)


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores, torch {torch.__version__}, {platform.system()}"


def model_card(r: dict) -> str:
    """The README.md next to the weights: what it is, how it was made, how good it is (measured)."""
    s = r["shape"]
    return f"""# {r["size"]} — a small Llama trained on Tiny Shakespeare

Trained by `scripts/train_chef.py` on this project's machine; loaded by the engine through the
same Hugging Face folder path as any hub checkpoint.

| | |
|---|---|
| architecture | LlamaForCausalLM, {s["num_hidden_layers"]} layers, d_model {s["hidden_size"]}, FFN {s["intermediate_size"]}, {s["num_attention_heads"]} heads / {s["num_key_value_heads"]} KV heads, tied embeddings |
| parameters | {r["n_params"]:,} ({r["weights_bytes"] / 1e6:.1f} MB fp32 safetensors) |
| tokenizer | byte-level BPE, {r["vocab_size"]:,} tokens, trained on the training split (`tokenizers`) |
| context | {r["context"]} tokens |
| data | Tiny Shakespeare (sha256 86c4e6aa…65ed), first 95 % train ({r["train_tokens"]:,} tokens), last 5 % validation |
| training | {r["steps_run"]} AdamW steps of {r["tokens_seen"] // max(1, r["steps_run"]):,} tokens ({r["tokens_seen"]:,} tokens seen), residual dropout {r["dropout"]}, peak LR {r["lr"]}, best checkpoint at step {r["best_step"]} |
| training time | {r["train_seconds"] / 60:.1f} min on {r["threads"]} thread(s){" (the wall-clock budget ran out before the planned steps; the LR schedule followed the clock)" if r["stopped_by_clock"] else ""} |
| machine | {r["machine"]} |
| seed | {r["seed"]} |

Exact command:

```
{r["command"]}
```

## Validation loss (last 5 % of the corpus, {r["val_tokens"]:,} tokens / {r["val_chars"]:,} characters)

| | nats per token | nats per character |
|---|---|---|
| this model | {r["val_nats_per_token"]:.3f} | {r["val_nats_per_char"]:.3f} |
| character-unigram baseline (training-split char frequencies) | — | {r["char_unigram_nats_per_char"]:.3f} |

![training curve](training_curve.png)

## Sample

Prompt `{r["sample_prompt"]}`, seed {r["seed"]}, temperature 0.8, top-k 40, 120 new tokens, unedited:

```
{r["sample"]}
```
"""


if __name__ == "__main__":
    main()

"""What a trained chef ships with besides its weights: the training curve, the model card, the sample.

Why a file of its own: the card is the only place a reader learns how the model was made and how good
it is, so every figure in it comes from the run's own report (`training.json`), never typed in.
A run continued from an earlier checkpoint (a longer context) keeps that checkpoint's report as
`init`, so the card tells both stages from their own numbers.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from engine.bench.contestants import cpu_name


def sample_text(model, tok, prompt: str, n: int, seed: int, temperature: float = 0.8) -> str:
    """A seeded sample (temperature 0.8, top-k 40) through HF generate, for the model card."""
    ids = torch.tensor([tok.encode(prompt).ids])
    torch.manual_seed(seed)
    out = model.generate(ids, max_new_tokens=n, do_sample=True, temperature=temperature, top_k=40)
    return tok.decode(out[0].tolist())


def machine_description() -> str:
    return f"{cpu_name()}, {os.cpu_count()} logical cores, torch {torch.__version__}, {platform.system()}"


def plot_curve(history: list[dict], baseline: float, path: Path, title: str, init_history=()) -> None:
    """Train and validation loss per step; a continued run draws its first stage before a dashed line."""
    import matplotlib  # lazy: matplotlib (a dev dependency) only for the curve

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: pyplot only after the Agg backend is chosen

    offset = max((h["step"] for h in init_history), default=0)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for stage, hist, shift in (("first stage, ", list(init_history), 0), ("", history, offset)):
        if not hist:
            continue
        tr = [h for h in hist if "train_nats_per_char" in h]
        va = [h for h in hist if "val_nats_per_char" in h]
        label = stage if stage else ("continued, " if init_history else "")
        ax.plot([h["step"] + shift for h in tr], [h["train_nats_per_char"] for h in tr],
                label=f"{label}train (batch)", alpha=0.5)
        ax.plot([h["step"] + shift for h in va], [h["val_nats_per_char"] for h in va], "o-",
                ms=3, label=f"{label}validation")
    if init_history:
        ax.axvline(offset, color="black", ls=":", lw=1, label="context grows here")
    ax.axhline(baseline, color="gray", ls="--", label=f"char-unigram baseline {baseline:.2f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss, nats per character")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _bands_table(r: dict) -> str:
    bands = r.get("val_bands") or []
    if not bands:
        return ""
    rows = "\n".join(
        f"| {b['start']}–{b['end'] - 1} | {b['tokens']:,} | {b['nats_per_token']:.3f} |" for b in bands
    )
    return f"""
Validation loss by position inside a {r["context"]}-token window (how much text the model had read
before the token it predicts):

| positions | tokens | nats per token |
|---|---|---|
{rows}
"""


def _init_section(r: dict) -> str:
    i = r.get("init")
    if not i:
        return ""
    return f"""
## Continued from a {i["context"]}-token chef

This model started from the weights of `{r["init_folder"]}` (context {i["context"]} tokens, trained
{i["steps_run"]} steps in {i["train_seconds"] / 60:.1f} min with `{i["command"]}`), then trained on
windows of {r["context"]} tokens so it reads and writes longer texts. Same tokenizer, same shape.

| validation, nats per token | the {i["context"]}-token chef | this model |
|---|---|---|
| windows of {i["context"]} tokens (the old limit) | {r["init_val_short_nats_per_token"]:.3f} | {r["val_short_nats_per_token"]:.3f} |
| windows of {r["context"]} tokens | {r["init_val_long_nats_per_token"]:.3f} | {r["val_nats_per_token"]:.3f} |

Both columns are measured by the same run on the same validation tokens; the old chef's loss on
windows longer than it was trained for shows why its context could not simply be raised.
"""


def model_card(r: dict) -> str:
    """The README.md next to the weights: what it is, how it was made, how good it is (measured)."""
    s = r["shape"]
    clock = " (the wall-clock budget ran out before the planned steps; the LR schedule followed the clock)"
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
| training time | {r["train_seconds"] / 60:.1f} min on {r["threads"]} thread(s){clock if r["stopped_by_clock"] else ""} |
| machine | {r["machine"]} |
| seed | {r["seed"]} |

Exact command:

```
{r["command"]}
```
{_init_section(r)}
## Validation loss (last 5 % of the corpus, {r["val_tokens"]:,} tokens / {r["val_chars"]:,} characters)

| | nats per token | nats per character |
|---|---|---|
| this model | {r["val_nats_per_token"]:.3f} | {r["val_nats_per_char"]:.3f} |
| character-unigram baseline (training-split char frequencies) | — | {r["char_unigram_nats_per_char"]:.3f} |
{_bands_table(r)}
![training curve](training_curve.png)

## Sample

Prompt `{r["sample_prompt"]}`, seed {r["seed"]}, temperature 0.8, top-k 40, 120 new tokens, unedited:

```
{r["sample"]}
```
"""

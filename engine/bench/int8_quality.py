"""`python -m engine bench int8-quality`: how faithful our int8 is to float32, measured as llama.cpp measures its quants.

Two measures, each for our int8 against our float32 and for llama.cpp's Q8_0 against its F32 of the
same weights (the model's safetensors converted to GGUF by llama.cpp's own converter):
  1. on a text (`--text`, a few thousand tokens of plain prose, read at run time): the KL divergence
     of int8's next-token distribution from float32's at every scored position (mean, median, 99th
     percentile, maximum), top-1 agreement and the perplexity ratio (engine/fidelity.py). llama.cpp's
     side is `llama-perplexity --kl-divergence-base` on F32, then `--kl-divergence` on Q8_0; its base
     file holds the token ids it evaluated, and ours are fed exactly those ids, ctx-token windows
     scored in their second half as it scores them;
  2. greedy agreement on five chat-templated questions: float32's answer up to its end-of-turn token
     (at most `max_new` tokens), and how many tokens int8's answer shares with it before the first
     difference; llama.cpp's through `llama-server` on the same prompt ids.

Without a llama.cpp build (scripts/build_llama_cpp.sh) only our side is measured, on the text as our
tokenizer splits it. Never in CI: the model and llama.cpp are fetched and built by hand.

Worked example of a row of the report: KL mean 0.0037, top-1 96.9 %, PPL ratio 1.0056 means int8's
next-token distribution differs from float32's by 0.0037 nats on average, names the same most
likely token at 96.9 % of positions, and finds the text 0.56 % more surprising.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine import Engine
from engine.bench.contestants import machine_facts
from engine.bench.peer_llama import DEFAULT_PREFIX, convert, find_build, gguf_path, greedy_tokens
from engine.bench.report import save_json
from engine.errors import EngineError, OneLineParser
from engine.fidelity import measure, prefix_agreement
from engine.loader import resolve_source

QUESTIONS = ("What is the capital of France?", "Name three vegetables that grow in a garden.",
             "Why do we cook pasta in salted water?", "How many legs does a spider have?",
             "Give me a tip for baking bread at home.")  # fmt: skip
DEFAULT_TEXT = Path("/work/shared/data/tinyshakespeare.txt")  # public-domain prose, read at run time
WORK = Path("/work/peers")  # GGUF files and llama.cpp's base logits live outside the repository


@dataclass(frozen=True)
class QualityPlan:
    ctx: int = 512  # tokens per window (llama-perplexity -c)
    chunks: int = 8  # windows: ctx x chunks tokens of the text
    max_new: int = 64  # greedy answer tokens at most
    threads: int = 2


def chat_ids(eng: Engine) -> list[list[int]]:
    return [eng.codec.chat_prompt([{"role": "user", "content": q}]).ids for q in QUESTIONS]


def answer(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    """A greedy continuation up to and including its first end-of-turn token."""
    end = next((i for i, t in enumerate(tokens) if t in eos), len(tokens) - 1)
    return tokens[: end + 1]


def agreement(references: list[list[int]], others: list[list[int]]) -> dict:
    """Per question, tokens shared before the first difference, of the reference answer's tokens."""
    shared = [prefix_agreement(r, o) for r, o in zip(references, others, strict=True)]
    return {"per_question": shared, "answer_tokens": [len(r) for r in references], "shared": sum(shared),
            "of": sum(len(r) for r in references)}  # fmt: skip


def ours(model: str, windows: list[list[int]] | None, text: str, plan: QualityPlan, progress) -> dict:
    ref, eng = Engine.load(model), Engine.load(model, quant="int8")
    if windows is None:  # no llama.cpp tokens to share: ours, as our tokenizer splits the text
        ids = eng.encode(text)[: plan.ctx * plan.chunks]
        windows = [ids[i : i + plan.ctx] for i in range(0, len(ids) - plan.ctx + 1, plan.ctx)]
    progress(f"ours: {len(windows)} windows of {plan.ctx} tokens, float32 and int8")
    fid = measure(ref, eng, windows)
    greedy = dict(max_new_tokens=plan.max_new, temperature=0.0, stop_at_eos=False)
    prompts = chat_ids(eng)
    eos = ref.cfg.eos_ids
    refs = [answer(t, eos) for t in ref.generate(prompts, **greedy).tokens]
    int8 = eng.generate(prompts, **greedy).tokens
    progress(f"ours: greedy answers, int8 shares {agreement(refs, int8)['shared']} tokens")
    return {"fidelity": asdict(fid) | {"ppl_ratio": fid.ppl_ratio}, "greedy": agreement(refs, int8),
            "answers_f32": [eng.codec.decode(r) for r in refs], "answers_int8": [eng.codec.decode(t) for t in int8],
            "native": {"float32": ref.native is not None and ref.native.ready,
                       "int8": eng.native is not None and eng.native.ready}}  # fmt: skip


# ---------------------------------------------------------------- llama.cpp's side


def base_tokens(path: Path) -> tuple[int, list[list[int]]]:
    """The windows llama-perplexity evaluated, from its base file: "_logits_", n_ctx (u32), n_vocab,
    n_chunk (i32 each), then n_chunk x n_ctx token ids (i32), then the log-probabilities."""
    with open(path, "rb") as f:
        head = f.read(20)
        if head[:8] != b"_logits_":
            raise EngineError(f"{path} is not a llama-perplexity base file")
        n_ctx, _, n_chunk = struct.unpack("<Iii", head[8:])
        ids = list(struct.unpack(f"<{n_ctx * n_chunk}i", f.read(4 * n_ctx * n_chunk)))
    return n_ctx, [ids[i * n_ctx : (i + 1) * n_ctx] for i in range(n_chunk)]


KLD_LINES = {"Mean PPL(Q)": "ppl", "Mean PPL(base)": "ppl_ref", "Mean PPL(Q)/PPL(base)": "ppl_ratio",
             "Mean    KLD": "kl_mean", "Maximum KLD": "kl_max", "99.0%   KLD": "kl_p99", "Median  KLD": "kl_median",
             "Same top p": "top1"}  # fmt: skip


def parse_kld(text: str) -> dict:
    """llama-perplexity --kl-divergence's summary lines -> the figures Fidelity holds (top1 as a fraction)."""
    out = {}
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip()
        for label, name in KLD_LINES.items():
            if key == label.strip() and ":" in line:
                value = float(line.split(":", 1)[1].split()[0])
                out[name] = value / 100 if name == "top1" else value
    missing = sorted(set(KLD_LINES.values()) - set(out))
    if missing:
        raise EngineError(f"llama-perplexity printed no {', '.join(missing)}")
    return out


def _perplexity(build, *args: str) -> str:
    cmd = [build.tool("llama-perplexity"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"llama-perplexity failed (exit {done.returncode}): {tail[0][:300]}")
    return done.stdout + "\n" + done.stderr


def llama_side(build, folder: str, model: str, text: Path, work: Path, plan: QualityPlan, prompts, eos, progress) -> dict:
    ggufs = {t: convert(build, folder, gguf_path(work / "gguf", model, t), t) for t in ("f32", "q8_0")}
    base = work / "kld" / f"{model}-f32-{plan.ctx}x{plan.chunks}.kld"
    base.parent.mkdir(parents=True, exist_ok=True)
    common = ["-c", str(plan.ctx), "-b", str(plan.ctx), "--chunks", str(plan.chunks), "-t", str(plan.threads)]
    progress("llama.cpp: F32 base logits (llama-perplexity --kl-divergence-base)")
    _perplexity(build, "-m", str(ggufs["f32"]), "-f", str(text), *common, "--kl-divergence-base", str(base))
    progress("llama.cpp: Q8_0 against them (--kl-divergence)")
    fid = parse_kld(_perplexity(build, "-m", str(ggufs["q8_0"]), *common, "--kl-divergence-base", str(base),
                                "--kl-divergence"))  # fmt: skip
    progress("llama.cpp: greedy answers (llama-server)")
    refs = [answer(greedy_tokens(build, ggufs["f32"], p, plan.max_new, plan.threads), eos) for p in prompts]
    q8 = [greedy_tokens(build, ggufs["q8_0"], p, plan.max_new, plan.threads) for p in prompts]
    return {"fidelity": fid, "greedy": agreement(refs, q8), "gguf": {k: str(v) for k, v in ggufs.items()}, "base_file": str(base)}


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m engine bench int8-quality", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="assistant", help="a trained model (default: the assistant)")
    p.add_argument("--text", default=str(DEFAULT_TEXT), help=f"plain text to score (default {DEFAULT_TEXT})")
    p.add_argument("--ctx", type=int, default=QualityPlan.ctx, help="tokens per window (default 512)")
    p.add_argument("--chunks", type=int, default=QualityPlan.chunks, help="windows of the text (default 8)")
    p.add_argument("--threads", type=int, default=QualityPlan.threads, help="threads for both sides (default 2)")
    p.add_argument("--llama-cpp", default=str(DEFAULT_PREFIX), help="llama.cpp's build prefix; 'none': ours only")
    p.add_argument("--work", default=str(WORK), help=f"where GGUF files and base logits go (default {WORK})")
    p.add_argument("--out", help="write the JSON report here (default: print it)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
        plan = QualityPlan(args.ctx, args.chunks, QualityPlan.max_new, args.threads)
        text = Path(args.text)
        if not text.is_file():
            raise EngineError(f"--text {text} is not a file: give a few thousand tokens of plain text")
        if plan.ctx < 16 or plan.chunks < 1:
            raise EngineError(f"--ctx must be >= 16 and --chunks >= 1 (got {plan.ctx}, {plan.chunks})")
        torch.set_num_threads(plan.threads)

        def progress(msg: str) -> None:
            print(f"[int8-quality] {msg}", file=sys.stderr, flush=True)

        t0 = time.perf_counter()
        folder = resolve_source(args.model)
        report: dict = {"model": args.model, "text": str(text), "plan": asdict(plan), "questions": list(QUESTIONS)}
        windows = None
        if args.llama_cpp != "none":
            build = find_build(args.llama_cpp)
            probe = Engine.load(args.model, native=False)
            report["llama.cpp"] = llama_side(build, folder, args.model, text, Path(args.work), plan, chat_ids(probe),
                                             probe.cfg.eos_ids, progress)  # fmt: skip
            ctx, windows = base_tokens(Path(report["llama.cpp"]["base_file"]))
            mine = probe.encode(text.read_text())[: ctx * len(windows)]
            report["tokens_equal_ours"] = sum(a == b for a, b in zip(mine, sum(windows, []), strict=False))
            report["tokens"] = ctx * len(windows)
            del probe
        report["ours"] = ours(args.model, windows, text.read_text(), plan, progress)
        report |= {"machine": machine_facts(), "elapsed_s": time.perf_counter() - t0,
                   "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = save_json(report, args.out)
    if not args.out:
        print(out)
    return 0


def table(report: dict) -> list[str]:
    """The report's rows as markdown: one per side, the figures the int8 page shows."""
    rows = []
    for side in ("ours", "llama.cpp"):
        if side in report:
            f, g = report[side]["fidelity"], report[side]["greedy"]
            rows.append(f"| {side} | {f['kl_mean']:.5f} | {f['kl_median']:.5f} | {f['kl_p99']:.4f} | {f['kl_max']:.3f} | "
                        f"{100 * f['top1']:.2f} % | {f['ppl_ratio']:.4f} | {g['shared']} of {g['of']} |")  # fmt: skip
    return rows


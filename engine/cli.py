"""Command line: `python -m engine generate | info | bench | serve-bench ...`.

Bad input (an EngineError, or a malformed flag) prints ONE line to stderr and exits with code 2,
so scripts and the lab can tell "you asked for something impossible" from a crash.

    python -m engine generate --model preset:smollm2-135m --prompt-ids 1,2,3 --max-new-tokens 16 --json
    python -m engine generate --model assistant --chat --prompt "What is the capital of France?"
    python -m engine fetch assistant     # download, verify and convert it once (engine/model_store.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from engine.engine import Engine
from engine.errors import EngineError, OneLineParser
from engine.events import Done
from engine.settings import EngineSettings

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m engine", description="Two-Pot Kitchen inference engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    gen = sub.add_parser("generate", help="run one request and print the tokens, texts and metrics")
    gen.add_argument("--model", required=True, help="folder, FILE.gguf, preset:NAME, embedded model name (chef, apprentice), "
                                                 "fetched model (assistant) or hub id")  # fmt: skip
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (needs a tokenizer)")
    prompt.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    gen.add_argument("--chat", action="store_true", help="send --prompt as one user message in the model's chat template")
    gen.add_argument("--batch", type=int, default=1, help="repeat the prompt N times")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32")
    gen.add_argument("--quant", default=None, help="int8: int8 matmul weights (engine/quant.py); default none")
    gen.add_argument("--compile", action="store_true",
                     help="decode steps through torch.compile (engine/compiled.py; needs a C++ compiler)")  # fmt: skip
    gen.add_argument("--kv-budget-bytes", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
    gen.add_argument("--cuda-graph", action="store_true", help="replay decode as a CUDA graph")
    gen.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    gen.add_argument("--speculate", type=int, default=0, help="draft tokens per decode step (speculative decoding)")
    gen.add_argument("--draft", default="ngram",
                     help="the draft: ngram (prompt lookup), apprentice, or any model with the same vocabulary")  # fmt: skip
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    info = sub.add_parser("info", help="print the model's ModelInfo as JSON")
    info.add_argument("--model", required=True)
    info.add_argument("--device", default="cpu")
    info.add_argument("--dtype", default="float32")
    fetch = sub.add_parser("fetch", help="download, verify and convert a fetched model into the model cache")
    fetch.add_argument("name", help="the model to fetch (assistant)")
    return parser


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise EngineError(f"--prompt-ids must be comma-separated integers (got '{text}')") from None


def run_generate(args) -> int:

    if args.batch < 1:
        raise EngineError(f"--batch must be at least 1 (got {args.batch})")
    if args.threads is not None:
        if args.threads < 1:
            raise EngineError(f"--threads must be at least 1 (got {args.threads})")
        import torch  # lazy: `info` and the bench forwarding never need torch in this process

        torch.set_num_threads(args.threads)  # process-wide: fine for a one-shot CLI run
    prompt = args.prompt if args.prompt is not None else parse_ids(args.prompt_ids)
    fetch_first(args.model)
    settings = EngineSettings(device=args.device, dtype=args.dtype, kv_budget_bytes=args.kv_budget_bytes,
                              quant=args.quant, compile=args.compile)  # fmt: skip
    eng = Engine.load(args.model, settings)
    if args.chat:
        if args.prompt is None or eng.codec is None:
            raise EngineError("--chat needs --prompt text and a model with a tokenizer")
        prompt = eng.codec.chat_prompt([{"role": "user", "content": args.prompt}]).ids
    if args.speculate:
        return run_speculative(eng, prompt, args)
    res = eng.generate(
        [prompt] * args.batch, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop_at_eos=not args.ignore_eos, cuda_graph=args.cuda_graph,
    )  # fmt: skip
    if args.json:
        print(json.dumps(res.to_dict()))
        return 0
    for i, (text, ids) in enumerate(zip(res.texts, res.tokens, strict=True)):
        print(f"[{i}] {text!r}  ids={ids}")
    m = res.metrics
    print(
        f"TTFT {m.ttft_s * 1e3:.1f} ms | TPOT {_num(m.tpot_s, 1e3, '.2f')} ms | E2E {m.e2e_s * 1e3:.1f} ms | "
        f"prefill {_num(m.prefill_tps, 1, ',.0f')} tok/s | decode {_num(m.decode_tps, 1, ',.1f')} tok/s | "
        f"KV {m.kv_cache_bytes:,} B"
    )
    return 0


def run_speculative(eng, prompt, args) -> int:
    """Speculative decoding runs on the serving path: one request through submit/step."""


    if args.batch != 1:
        raise EngineError(f"--speculate serves one prompt at a time here (got --batch {args.batch})")
    eng.submit(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
               seed=args.seed, stop_at_eos=not args.ignore_eos, speculate=args.speculate, draft=args.draft)  # fmt: skip
    res = None
    while not eng.idle:
        res = next((e.result for e in eng.step() if isinstance(e, Done)), res)
    spec = res.speculation
    if args.json:
        out = {"tokens": [res.tokens], "texts": [res.text], "finish_reason": res.finish_reason}
        derived = {"mean_acceptance_length": spec.mean_acceptance_length, "acceptance_rate": spec.acceptance_rate}
        out |= asdict(res.metrics) | {"speculation": asdict(spec) | derived}
        print(json.dumps(out))
        return 0
    m = res.metrics
    print(f"[0] {res.text!r}  ids={res.tokens}")
    print(f"TTFT {m.ttft_s * 1e3:.1f} ms | TPOT {_num(m.tpot_s, 1e3, '.2f')} ms | drafts {spec.drafts}, "
          f"accepted {spec.accepted}/{spec.drafted} | mean acceptance length {spec.mean_acceptance_length:.2f}")  # fmt: skip
    return 0


def run_info(args) -> int:
    fetch_first(args.model)
    print(json.dumps(asdict(Engine.load(args.model, EngineSettings(device=args.device, dtype=args.dtype)).info)))
    return 0


def fetch_first(model: str) -> None:
    """A fetched model not yet in the cache is fetched here, with a progress bar on stderr, before loading."""
    from engine import model_store  # lazy: only names of fetched models need it

    if model in model_store.RECIPES and model_store.cached(model) is None and not Path(model).exists():
        bar = ProgressBar()
        try:
            model_store.ensure(model, bar)
        finally:
            bar.close()


class ProgressBar:
    """`[##########..........]  52%  assistant: downloading 48.3 of 92.9 MB` on a terminal, redrawn in
    place; elsewhere (a log, CI) one line per stage once it has begun (so a fetch that fails at once
    leaves only its error line)."""

    def __init__(self, out=None):
        self.out, self.stage, self.drawn = out or sys.stderr, None, False

    def __call__(self, p) -> None:
        tty = self.out.isatty()
        if (not tty and p.stage == self.stage) or (p.stage == "download" and not p.done) or p.stage == "failed":
            return
        self.stage, self.drawn = p.stage, True
        filled = int(20 * p.fraction)
        line = f"[{'#' * filled}{'.' * (20 - filled)}] {p.fraction:4.0%}  {p.line}"
        self.out.write("\r" + line.ljust(79) if tty else line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.drawn and self.out.isatty():
            self.out.write("\n")
            self.out.flush()


def run_fetch(args) -> int:
    from engine import model_store  # lazy: as above

    print(model_store.ensure(args.name, ProgressBar()))
    return 0


def run_bench(argv: list[str]) -> int:
    """`python -m engine bench | serve-bench ...`: the benchmarks' command line (engine/bench/cli.py).
    The bench is the engine's own subpackage, built on the engine and imported by nothing else in
    it, so the inference code never loads it."""
    from engine.bench.cli import (
        main as bench_main,  # lazy: the bench's imports (HF transformers, the peers) only for bench commands
    )

    return bench_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["bench"]:
            return run_bench(argv[1:])
        if argv[:1] == ["serve-bench"]:
            return run_bench(argv)
        args = build_parser().parse_args(argv)
        return {"generate": run_generate, "info": run_info, "fetch": run_fetch}[args.command](args)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `... --json | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0


def _num(value: float | None, scale: float, spec: str) -> str:
    """A measured number, or a dash where it was not measured (a one-token answer has no TPOT)."""
    return "—" if value is None else format(value * scale, spec)

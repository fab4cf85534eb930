"""llama.cpp, the peer: find its build, convert our weights to GGUF, time it, ask it for greedy tokens.

Everything here drives llama.cpp's own programs (scripts/build_llama_cpp.sh builds them from the
source PyPI's llama-cpp-python sdist vendors): `llama-bench` for batch-1 decode and prefill,
`llama-batched-bench` for many sequences at once, `llama-server` for the greedy tokens of a
token-id prompt. GGUF files come from the tree's own `convert_hf_to_gguf.py`.

The chef's tokenizer is a byte-level BPE with GPT-2's pre-tokenizer regex that the converter's
table of known tokenizers (keyed by a hash of how it splits a test string) does not list. The
converter runs here in a child process with that one hash mapped to "gpt-2" (`EXTRA_PRE`);
everything else about the conversion is the converter's.
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from engine.errors import EngineError

DEFAULT_PREFIX = Path("/work/peers/llama.cpp")
BUILD_HINT = "scripts/build_llama_cpp.sh"
TOOLS = ("llama-bench", "llama-batched-bench", "llama-server")
# Pre-tokenizer hashes the converter does not know, and the llama.cpp pre-tokenizer each one is.
EXTRA_PRE = {"593bb4df7d3bea0b0a6b54667111959fc8e66deaa178928a480a2b140e202d13": "gpt-2"}  # the chef's
OUTTYPES = ("f32", "q8_0")


@dataclass(frozen=True)
class LlamaBuild:
    """Where llama.cpp lives: its programs (bin) and the source tree that holds the converter."""

    bin: Path
    tree: Path

    def tool(self, name: str) -> str:
        return str(self.bin / name)


def find_build(prefix: str | os.PathLike | None = None) -> LlamaBuild:
    """The build under `prefix` (default /work/peers/llama.cpp), or one line saying how to make it."""
    root = Path(prefix) if prefix else DEFAULT_PREFIX
    bin_dir, tree = root / "build" / "bin", root / "tree"
    missing = [t for t in TOOLS if not os.access(bin_dir / t, os.X_OK)]
    if missing or not (tree / "convert_hf_to_gguf.py").is_file():
        what = ", ".join(missing) if missing else "convert_hf_to_gguf.py"
        raise EngineError(
            f"llama.cpp not found under {root} (missing {what}): build it with {BUILD_HINT} {root}, "
            "or pass --llama-cpp PREFIX"
        )
    return LlamaBuild(bin_dir, tree)


# ---------------------------------------------------------------- GGUF conversion


def gguf_path(out_dir: Path, name: str, outtype: str) -> Path:
    return out_dir / f"{name}-{outtype}.gguf"


def convert(build: LlamaBuild, hf_folder: str, out: Path, outtype: str) -> Path:
    """`hf_folder` -> GGUF `out` (kept if it exists and is newer than the weights)."""
    if outtype not in OUTTYPES:
        raise EngineError(f"GGUF type must be one of {', '.join(OUTTYPES)} (got {outtype!r})")
    weights = Path(hf_folder) / "model.safetensors"
    if out.is_file() and (not weights.is_file() or out.stat().st_mtime >= weights.stat().st_mtime):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    cmd = [sys.executable, "-m", "engine.bench.peer_llama", "convert", str(build.tree), hf_folder, str(tmp), outtype]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not tmp.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"converting {hf_folder} to GGUF {outtype} failed: {tail[0][:300]}")
    tmp.replace(out)
    return out


def _run_converter(tree: str, folder: str, out: str, outtype: str) -> None:
    """In the child: the tree's converter, with EXTRA_PRE's hashes known to its pre-tokenizer table."""
    sys.path[:0] = [tree, os.path.join(tree, "gguf-py")]
    import conversion.base as base  # lazy: the tree's converter package, importable only after the path change

    known = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        seen: list = []

        class Recording:  # the tokenizer, remembering what it encoded (the converter's test string)
            def __getattr__(self, name):
                return getattr(tokenizer, name)

            def encode(self, *args, **kwargs):
                seen.append(tokenizer.encode(*args, **kwargs))
                return seen[-1]

        try:
            return known(self, Recording())
        except NotImplementedError:
            digest = sha256(str(seen[-1]).encode()).hexdigest() if seen else ""
            if digest in EXTRA_PRE:
                return EXTRA_PRE[digest]
            raise

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", outtype]
    runpy.run_path(os.path.join(tree, "convert_hf_to_gguf.py"), run_name="__main__")


# ---------------------------------------------------------------- timing


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise EngineError(f"{Path(cmd[0]).name} ran past {timeout:.0f} s") from err
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"{Path(cmd[0]).name} failed (exit {done.returncode}): {tail[0][:300]}")
    return done


def llama_bench(build: LlamaBuild, gguf: Path, threads: int, prompt: int, new: int, depth: int) -> dict:
    """One llama-bench run: tokens/s of prefill (`prompt` tokens) and of decode (`new` tokens after
    `depth` cached ones), each timed once (`-r 1`): the rounds outside make the repeats."""
    out = {}
    for key, args in (("prefill_tps", ["-p", str(prompt), "-n", "0"]),
                      ("decode_tps", ["-p", "0", "-n", str(new), "-d", str(depth)])):  # fmt: skip
        text = _run([build.tool("llama-bench"), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json",
                     *args], timeout=600)  # fmt: skip
        rows = json.loads(text.stdout)
        out[key] = float(rows[0]["avg_ts"])
    return out


def batched_bench(build: LlamaBuild, gguf: Path, threads: int, seqs: int, prompt: int, new: int) -> float:
    """Decode tokens/s of `seqs` sequences at once (llama-batched-bench's S_TG), each with its own prompt."""
    ctx = seqs * (prompt + new) + 16
    text = _run([build.tool("llama-batched-bench"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
                 "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(new),
                 "-npl", str(seqs), "--output-format", "jsonl"], timeout=600)  # fmt: skip
    lines = (text.stdout + "\n" + text.stderr).splitlines()  # it logs its result lines to stderr
    # a result line may share its line with a log line written at the same moment: parse from its brace
    rows = [json.loads(ln[ln.index('{"n_kv_max"') :]) for ln in lines if '{"n_kv_max"' in ln]
    if not rows:
        raise EngineError("llama-batched-bench printed no result line")
    return float(rows[-1]["speed_tg"])


# ---------------------------------------------------------------- greedy tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def greedy_tokens(build: LlamaBuild, gguf: Path, prompt: list[int], n: int, threads: int) -> list[int]:
    """llama.cpp's greedy continuation of a token-id prompt (no BOS added), through llama-server."""
    port = _free_port()
    cmd = [build.tool("llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-c", str(len(prompt) + n + 16), "-t", str(threads), "--no-webui", "-np", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise EngineError(f"llama-server exited (code {proc.returncode}) before it was ready")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EngineError("llama-server was not ready within 60 s")
            time.sleep(0.2)
        body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"],
                "ignore_eos": True, "return_tokens": True, "cache_prompt": False}  # fmt: skip
        req = urllib.request.Request(f"{base}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=120) as r:
            return [int(t) for t in json.loads(r.read())["tokens"]]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":  # the converter's child process (see `convert`)
    if sys.argv[1:2] != ["convert"] or len(sys.argv) != 6:
        raise SystemExit("usage: python -m engine.bench.peer_llama convert TREE HF_FOLDER OUT.gguf f32|q8_0")
    _run_converter(*sys.argv[2:])

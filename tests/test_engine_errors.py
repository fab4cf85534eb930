"""Bad input: every refusal is one EngineError line naming the problem and the limit, and the engine
keeps working afterwards. The CLI turns the same refusals into exit code 2 + one stderr line."""

import json
import os
import sys

import pytest
import torch
from conftest import REPO
from proc_kit import run, said

from engine import Engine, EngineError

PROMPT = [11, 57, 3, 200, 42, 9, 101, 7]


@pytest.fixture(scope="module")
def eng(tiny_llama):
    return Engine.load(str(tiny_llama.path), kv_budget_bytes=120_000)


@pytest.fixture(scope="module")
def baseline(eng):
    return eng.generate([PROMPT], max_new_tokens=6).tokens


def refuse(fn, *patterns):
    with pytest.raises(EngineError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg
    for p in patterns:
        assert p in msg, msg
    return msg


@pytest.mark.parametrize(
    "prompts, kwargs, patterns",
    [
        ([], {}, ["no prompts"]),
        ([[]], {}, ["prompt 1 is empty"]),
        ([PROMPT, []], {}, ["prompt 2 is empty"]),
        ([list(range(129))], {}, ["129 tokens", "context is 128"]),
        ([PROMPT * 12], {"max_new_tokens": 40}, ["96 tokens", "max_new_tokens 40", "136", "context of 128"]),
        ([[1, 320]], {}, ["token id 320", "320 ids", "0..319"]),
        ([[-1, 5]], {}, ["token id -1"]),
        ([PROMPT] * 4, {"max_new_tokens": 32}, ["81,920 bytes of KV", "115,712 bytes of prefill working memory",
                                                 "budget is 120,000 bytes", "at most 2"]),
        ([PROMPT], {"max_new_tokens": 0}, ["max_new_tokens must be at least 1"]),
        ([PROMPT], {"temperature": -1.0}, ["temperature"]),
        ([PROMPT], {"top_p": 0.0}, ["top_p"]),
        ([PROMPT], {"top_k": -3}, ["top_k"]),
        ([PROMPT], {"cache": "paged"}, ["unknown setting 'cache'", "temperature"]),
        ([PROMPT], {"batching": "ragged"}, ["unknown setting 'batching'"]),
        ([PROMPT], {"beams": 4}, ["unknown setting 'beams'"]),
        ([PROMPT], {"cuda_graph": True}, ["cuda_graph=True needs a CUDA device"]),
        (["hello"], {}, ["no tokenizer", "token-id lists"]),
        ("hello", {}, ["list of strings"]),
        ([[1, "a"]], {}, ["prompt 1 is neither"]),
    ],
)
def test_bad_requests_are_refused_and_the_engine_keeps_working(eng, baseline, prompts, kwargs, patterns):
    refuse(lambda: eng.generate(prompts, **kwargs), *patterns)
    refuse(lambda: eng.check(prompts, **kwargs), *patterns)
    assert eng.generate([PROMPT], max_new_tokens=6).tokens == baseline


def test_limits_say_how_big_a_batch_fits(eng):
    lim = eng.limits(8, 32)
    assert lim.kv_bytes_per_token == eng.cfg.kv_bytes_per_token(4) == 512
    from engine.costs import prefill_work_bytes

    assert lim.work_bytes_per_sequence == prefill_work_bytes(eng.cfg, 8, 8, 4) == 28_928
    assert lim.max_batch == 120_000 // (40 * 512 + 28_928) == 2
    assert lim.max_context == 128
    eng.check([PROMPT] * lim.max_batch, max_new_tokens=32)  # exactly the limit is fine


def test_bad_model_sources(tmp_path):
    refuse(lambda: Engine.load(str(tmp_path / "no_such_model")), "no_such_model", "not found")
    (tmp_path / "empty").mkdir()
    refuse(lambda: Engine.load(str(tmp_path / "empty")), "no config.json")
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text(json.dumps({"model_type": "llama"}))
    refuse(lambda: Engine.load(str(weightless)), "lacks the field 'hidden_size'")
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    refuse(lambda: Engine.load(str(bert)), "unsupported architecture 'bert'", "BertModel")
    clipped = tmp_path / "clipped"
    clipped.mkdir()
    (clipped / "config.json").write_text(json.dumps({"model_type": "olmo", "clip_qkv": 8.0}))
    refuse(lambda: Engine.load(str(clipped)), "unsupported option 'clip_qkv'")
    refuse(lambda: Engine.load("preset:gpt-5"), "unknown preset 'gpt-5'", "preset:smollm2-135m")


def test_folder_without_weights(tiny_llama, tmp_path):
    folder = tmp_path / "no_weights"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_llama.path / "config.json").read_text())
    refuse(lambda: Engine.load(str(folder)), "no *.safetensors")


def test_weights_of_the_wrong_shape(tiny_llama, tmp_path):
    folder = tmp_path / "wrong_shape"
    folder.mkdir()
    cfg = json.loads((tiny_llama.path / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 96}))
    (folder / "model.safetensors").write_bytes((tiny_llama.path / "model.safetensors").read_bytes())
    refuse(lambda: Engine.load(str(folder)), "gate_proj.weight", "(128, 64)", "(96, 64)")


def test_bad_device_and_dtype(tiny_llama):
    refuse(lambda: Engine.load(str(tiny_llama.path), dtype="float8"), "invalid dtype 'float8'", "bfloat16")
    refuse(lambda: Engine.load(str(tiny_llama.path), device="tpu"), "device 'tpu'")
    if not torch.cuda.is_available():
        refuse(lambda: Engine.load(str(tiny_llama.path), device="cuda"), "no CUDA GPU")


def test_preset_refused_before_building_when_memory_is_short(monkeypatch):
    import engine.presets as presets

    monkeypatch.setattr(presets, "available_memory", lambda device: 1_000_000_000)  # a 1 GB machine
    msg = refuse(lambda: Engine.load("preset:llama-3.2-1b"), "preset:llama-3.2-1b needs", "1.00 GB")
    assert f"{presets.bytes_needed('llama-3.2-1b', torch.float32) / 1e9:.2f} GB" in msg


def run_cli(*args):
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return run([sys.executable, "-m", "engine", *args], env=env, timeout=120, check=False)


def test_cli_exits_2_with_one_stderr_line(tiny_llama, tmp_path):
    cases = [
        (["--prompt-ids", "1,320"], "token id 320"),
        (["--prompt-ids", "1,x"], "comma-separated integers"),
        (["--prompt-ids", "1,2", "--dtype", "float8"], "invalid dtype"),
        (["--prompt", "hello"], "no tokenizer"),
    ]
    for extra, pattern in cases:
        proc = run_cli("generate", "--model", str(tiny_llama.path), *extra)
        assert proc.returncode == 2, said(proc)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and pattern in lines[0], said(proc)
    proc = run_cli("generate", "--model", str(tmp_path / "missing"), "--prompt-ids", "1")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, said(proc)


def test_cli_json_matches_the_engine(tiny_llama):
    proc = run_cli("generate", "--model", str(tiny_llama.path), "--prompt-ids", ",".join(map(str, PROMPT)),
                   "--batch", "2", "--max-new-tokens", "5", "--json")  # fmt: skip
    assert proc.returncode == 0, said(proc)
    out = json.loads(proc.stdout)
    for key in ("tokens", "texts", "ttft_s", "tpot_s", "itl_s", "e2e_s", "prefill_s", "kv_cache_bytes"):
        assert key in out
    expected = Engine.load(str(tiny_llama.path)).generate([PROMPT], max_new_tokens=5).tokens[0]
    assert out["tokens"] == [expected, expected]
    assert len(out["itl_s"]) == 4 and out["ttft_s"] <= out["e2e_s"]
    # the lessons' other kitchens are the lab's (lab/kitchens.py): the engine's CLI has no such option
    proc = run_cli("generate", "--model", str(tiny_llama.path), "--prompt-ids", "1,2", "--cache", "growing")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--cache" in proc.stderr, said(proc)


def test_cli_info_and_bench_dispatch(tiny_llama, capfd):
    from engine.cli import main

    assert main(["info", "--model", str(tiny_llama.path)]) == 0
    info = json.loads(capfd.readouterr().out)
    assert info["family"] == "llama" and info["n_layers"] == 2 and info["trained"] is True
    # `bench` is the engine's bench subpackage's command line: its refusal is its one line and exit code 2
    assert main(["bench", "--repeats", "abc"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeats" in err[0] and "python -m engine bench" in err[0]

"""guidellm (the vLLM project's serving benchmark, a client nobody here wrote) against the class kitchen:
a small concurrent run on each OpenAI route, 0 errors, every answer the exact length asked for.

Bounded: 16 requests of 32 prompt tokens and 16 new ones, 4 at a time, per route (about 15 s each
on the chef, most of it guidellm's own start-up)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from kitchen_server import kitchen
from proc_kit import run

CHEF = Path(__file__).resolve().parent.parent / "engine" / "models" / "chef"
GUIDELLM = shutil.which("guidellm", path=str(Path(sys.executable).parent)) or shutil.which("guidellm")
REQUESTS, PROMPT, OUTPUT = 16, 32, 16


@pytest.fixture(scope="module")
def served():
    with kitchen() as (url, client):
        yield url


@pytest.mark.skipif(GUIDELLM is None, reason="guidellm is not installed (pip install -e '.[dev]' installs it)")
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_runs_clean_on_both_routes(served, route, tmp_path):
    out = tmp_path / "guidellm.json"
    cmd = [GUIDELLM, "run", "--backend", f"kind=openai_http,target={served},request_format={route}",
           "--profile", "kind=concurrent,streams=4", "--constraint", f"kind=max_requests,count={REQUESTS}",
           "--constraint", "kind=max_duration,seconds=90",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT},output_tokens={OUTPUT}",
           "--tokenizer", f"kind=huggingface_auto,model={CHEF}", "--output", f"kind=json,path={out}",
           "--disable-console"]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    run(cmd, timeout=180, env=env, cwd=tmp_path)
    bench = json.loads(out.read_text())["benchmarks"][0]
    totals = bench["metrics"]["request_totals"]
    assert totals == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}, totals
    tokens = bench["metrics"]["output_token_count"]["successful"]
    assert tokens["min"] == tokens["max"] == OUTPUT  # ignore_eos and max_(completion_)tokens honoured
    sent = json.loads(bench["requests"]["successful"][0]["request_args"])["body"]
    assert sent["ignore_eos"] is True  # what guidellm really sends, so the test covers it
    chat = route.endswith("chat/completions")
    assert ("messages" in sent) == chat and ("prompt" in sent) != chat
    assert not chat or isinstance(sent["messages"][0]["content"], list)  # chat content as a list of text parts

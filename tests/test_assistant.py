"""The real assistant (SmolLM2-135M-Instruct, Q4_1 GGUF) against transformers reading the same GGUF.

Our engine loads the folder the model store converted once this session; the reference is
`from_pretrained(gguf_file=...)`, which dequantizes the file by its own code. Greedy tokens must be
equal: chat-templated questions, prompts of several lengths, a batch of mixed lengths, a reused
prompt prefix, speculative decoding with the n-gram draft, and the command line on both the
`assistant` name and the GGUF file. Generations are short to keep the suite's time modest.
"""

import json
import os
import sys

import pytest
import torch

from engine import Engine
from engine.events import Done
from engine.model_store import ASSISTANT
from tests.conftest import REPO
from tests.proc_kit import run

QUESTIONS = ["What is the capital of France?", "Name three vegetables that grow in a garden.", "Why do we cook pasta in salted water?"]
PASSAGE = ("In a busy kitchen two pots share one stove. The wok tosses everything at once, hot and fast, "
           "while the soup pot is ladled one bowl at a time for every table that waits. ")  # fmt: skip
_memo: dict = {}


@pytest.fixture(scope="module")
def hf(assistant):
    return assistant.hf()


@pytest.fixture(scope="module")
def hf_tok(assistant):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(assistant.gguf.parent), gguf_file=assistant.gguf.name)


@pytest.fixture(scope="module")
def eng(assistant):
    return Engine.load(str(assistant.folder))


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """transformers' greedy answer (stops at the model's end-of-turn token, as ours does); memoized."""
    key = (tuple(ids), n)
    if key not in _memo:
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=2)
        _memo[key] = out[0, len(ids):].tolist()
    return _memo[key]


def chat(eng, question: str) -> list[int]:
    return eng.codec.chat_prompt([{"role": "user", "content": question}]).ids


def test_the_converted_folder_is_the_pinned_model(assistant, eng):
    config = json.loads((assistant.folder / "config.json").read_text())
    assert {k: config[k] for k in ASSISTANT.config} == ASSISTANT.config
    assert json.loads((assistant.folder / "source.json").read_text())["sha256"] == ASSISTANT.sha256
    info = eng.info
    assert (info.family, info.n_params, info.vocab_size, info.max_context) == ("llama", 134_515_008, 49_152, 8192)
    assert info.trained and info.has_chat_template and eng.cfg.eos_ids == (2,)


def test_chat_prompts_are_the_models_template_and_answer_as_hf(eng, hf, hf_tok):
    answers = []
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        prompt = eng.codec.chat_prompt(messages)
        assert prompt.ids == list(hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                             return_dict=False))  # fmt: skip
        assert prompt.template_tokens == len(prompt.ids) - len(eng.encode(question)) > 20  # the system turn
        res = eng.generate([prompt.ids], max_new_tokens=20)
        assert res.tokens[0] == hf_greedy(hf, prompt.ids, 20)
        answers.append(res.texts[0])
    assert answers[0].startswith("The capital of France is Paris")


@pytest.mark.parametrize("words", [3, 60, 400])
def test_prompts_of_several_lengths_continue_as_hf(eng, hf, words):
    ids = eng.encode(" ".join((PASSAGE * 12).split()[:words]))
    assert eng.generate([ids], max_new_tokens=8).tokens[0] == hf_greedy(hf, ids, 8)


def test_a_batch_of_mixed_lengths_answers_each_prompt_as_alone(eng, hf):
    prompts = [chat(eng, QUESTIONS[0]), eng.encode(PASSAGE * 3), chat(eng, "Hi!")]
    res = eng.generate(prompts, max_new_tokens=12)
    assert res.tokens == [hf_greedy(hf, p, 12) for p in prompts]


def test_a_reused_system_prompt_prefix_gives_the_same_answer(assistant, eng, hf):
    """Two conversations share the template's system turn; the second starts from its cached K/V."""
    served = Engine.load(str(assistant.folder), policy="continuous", prefix_cache=True)
    results = []
    for question in QUESTIONS[:2]:
        rid = served.submit(chat(eng, question), 12)
        while not served.idle:
            results += [e.result for e in served.step() if isinstance(e, Done) and e.request_id == rid]
    assert results[0].metrics.cached_tokens == 0 and results[1].metrics.cached_tokens >= 20
    assert [r.tokens for r in results] == [hf_greedy(hf, chat(eng, q), 12) for q in QUESTIONS[:2]]


def test_speculative_decoding_with_the_ngram_draft_keeps_the_greedy_answer(assistant, eng, hf):
    ids = chat(eng, "Repeat this sentence exactly: " + PASSAGE)
    served = Engine.load(str(assistant.folder), policy="continuous")
    rid = served.submit(ids, 24, speculate=4, draft="ngram")
    done = []
    while not served.idle:
        done += [e.result for e in served.step() if isinstance(e, Done) and e.request_id == rid]
    assert done[0].tokens == hf_greedy(hf, ids, 24)
    assert done[0].speculation.drafts > 0


@pytest.mark.parametrize("source", ["assistant", "gguf"])
def test_the_command_line_gives_hfs_greedy_tokens(assistant, eng, hf, source):
    """`python -m engine generate --model assistant|FILE.gguf --prompt "What is the capital of France?" --json`."""
    model = "assistant" if source == "assistant" else str(assistant.gguf)
    args = [sys.executable, "-m", "engine", "generate", "--model", model, "--prompt", QUESTIONS[0], "--json"]
    env = {**os.environ, **assistant.env}
    out = run(args, env=env, cwd=REPO, timeout=300)
    assert json.loads(out.stdout)["tokens"][0] == hf_greedy(hf, eng.encode(QUESTIONS[0]), 32)
    if source == "assistant":  # and as a chat: the model's template around the question
        out = run([*args, "--chat", "--max-new-tokens", "20"], env=env, cwd=REPO, timeout=300)
        answer = json.loads(out.stdout)
        assert answer["tokens"][0] == hf_greedy(hf, chat(eng, QUESTIONS[0]), 20) and "Paris" in answer["texts"][0]


def test_serve_model_assistant_answers_chat_completions_with_its_template(assistant, eng, hf, monkeypatch):
    """`two-pot-kitchen serve --model assistant`, asked through the official `openai` client:
    /v1/chat/completions renders the model's own template and answers the question."""
    from openai import OpenAI

    from tests.kitchen_server import kitchen_process

    for key, value in assistant.env.items():
        monkeypatch.setenv(key, value)
    ids = chat(eng, QUESTIONS[0])
    with kitchen_process("--model", "assistant", "--threads", "1") as (url, _):
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["assistant"]
        answer = client.chat.completions.create(model="assistant", max_tokens=20, temperature=0,
                                                messages=[{"role": "user", "content": QUESTIONS[0]}])  # fmt: skip
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.choices[0].message.content == eng.decode(hf_greedy(hf, ids, 20))
    assert "Paris" in answer.choices[0].message.content and "<|im" not in answer.choices[0].message.content

"""A model's own chat template (engine/chat.py): rendered as transformers renders it, counted, and the
one path /v1/chat/completions takes. A template's own refusal (raise_exception) is one 422 line."""

import json
import shutil

import httpx
import pytest

from engine import Engine, EngineError
from engine.chat import ChatTemplate
from tests.kitchen_server import kitchen

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ raise_exception('this model takes no system turns') }}{% endif %}"
            "<|{{ m['role'] }}|>{{ m['content'] | trim }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip
MESSAGES = [{"role": "user", "content": " The wok or the pot? "}, {"role": "assistant", "content": "Both."},
            {"role": "user", "content": "Which is first?"}]  # fmt: skip


@pytest.fixture(scope="module")
def templated(tiny_llama_tok, tmp_path_factory):
    """The tiny tokenizer model with a chat template and a BOS token in tokenizer_config.json."""
    folder = tmp_path_factory.mktemp("templated") / "templated"
    shutil.copytree(tiny_llama_tok.path, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "bos_token": "<eos>", "eos_token": "<eos>", "tokenizer_class": "PreTrainedTokenizerFast"}))  # fmt: skip
    return folder


def test_rendering_and_ids_equal_transformers_apply_chat_template(templated):
    from transformers import AutoTokenizer

    eng = Engine.load(str(templated))
    hf = AutoTokenizer.from_pretrained(str(templated))
    prompt = eng.codec.chat_prompt(MESSAGES)
    assert prompt.text == hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt.text.startswith("<eos><|user|>The wok or the pot?\n") and prompt.text.endswith("<|assistant|>")
    assert prompt.ids == eng.encode(prompt.text)
    assert prompt.content_tokens == sum(len(eng.encode(m["content"])) for m in MESSAGES)
    assert eng.info.has_chat_template


@pytest.mark.parametrize(("messages", "pattern"), [
    ([{"role": "system", "content": "Be brief."}], "refused these messages: this model takes no system turns"),
    ([], "messages must be a non-empty list"),
    ([{"role": "user"}], 'message 0 must be {"role": str, "content": str}'),
])  # fmt: skip
def test_refusals_are_one_line(templated, messages, pattern):
    with pytest.raises(EngineError, match=pattern) as err:
        Engine.load(str(templated)).codec.chat_prompt(messages)
    assert "\n" not in str(err.value)


def test_a_model_without_a_template_says_so(tiny_llama_tok):
    eng = Engine.load(str(tiny_llama_tok.path))
    assert not eng.info.has_chat_template
    with pytest.raises(EngineError, match="this model has no chat template"):
        eng.codec.chat_prompt(MESSAGES)
    with pytest.raises(EngineError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_chat_completions_send_the_models_own_template(templated):
    eng = Engine.load(str(templated))
    ids = eng.codec.chat_prompt(MESSAGES).ids
    with kitchen(model=str(templated)) as (url, _):
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 6, "temperature": 0,
                                                           "ignore_eos": True}, timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["prompt_tokens"] == len(ids)
        assert body["choices"][0]["message"]["content"] == eng.generate([ids], 6, stop_at_eos=False).texts[0]
        refused = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                             json={"messages": [{"role": "system", "content": "Be brief."}], "max_tokens": 2})  # fmt: skip
        assert refused.status_code == 422
        assert "this model takes no system turns" in refused.json()["error"]["message"]

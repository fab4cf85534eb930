"""The Kitchen's written prompt on an instruct model (kitchen_viz/chat_order.py): the learner's text
goes as the user's message in the model's own template, through the kitchen's host in process and
over HTTP, and the form counts the template's tokens apart from the learner's; a model without a
template cooks the text as written. The engine is real (the tiny tokenizer model with a template)."""

import pytest

from engine import Engine
from kitchen_viz.chat_order import PromptCount, chat_template, generated_note, written_prompt
from serving.host_client import HostClient
from tests.kitchen_server import kitchen
from tests.test_chat_template import templated  # noqa: F401 -- the fixture

QUESTION = "Which pot is first?"


@pytest.mark.parametrize("where", ["in process", "over HTTP"])
def test_a_written_prompt_is_the_users_message_in_the_models_template(templated, where):  # noqa: F811
    eng = Engine.load(str(templated))
    chat = eng.codec.chat_prompt([{"role": "user", "content": QUESTION}])
    with kitchen(model=str(templated)) as (url, process):
        svc = HostClient(process.host if where == "in process" else url, process.host.name)
        try:
            assert svc.wait_ready(60) and chat_template(svc.about) is not None
            written = written_prompt(svc, QUESTION, 8)
        finally:
            svc.close()
    assert written.text == chat.text and written.text.endswith("<|assistant|>")
    assert (written.tokens, written.yours) == (len(chat.ids), len(eng.encode(QUESTION)))
    assert written.template_tokens == chat.template_tokens > 0
    assert written.line == (f"Your prompt is {written.tokens} tokens: {written.yours} yours + "
                            f"{written.template_tokens} from the {svc.model}'s chat template "
                            f"(the wok cooks all {written.tokens}).")  # fmt: skip


def test_a_model_without_a_template_cooks_the_text_as_written(tiny_llama_tok):
    with kitchen(model=str(tiny_llama_tok.path)) as (_, process):
        svc = HostClient(process.host, process.host.name)
        try:
            assert svc.wait_ready(60) and chat_template(svc.about) is None
            written = written_prompt(svc, QUESTION, 8)
        finally:
            svc.close()
    n = len(Engine.load(str(tiny_llama_tok.path)).encode(QUESTION))
    assert written == PromptCount(QUESTION, n, n) and written.line == f"Your prompt is {n} tokens."


def test_a_generated_prompt_says_it_goes_without_the_template():
    note = generated_note("assistant", 32)
    assert "exactly 32 tokens" in note and "without the assistant's chat template" in note


def test_the_assistant_opens_on_a_question_and_a_lesson_link_still_cooks_generated_verse(assistant, monkeypatch):
    """On the Kitchen page (AppTest): choosing the assistant opens the prompt box on a question; a
    lesson's link (`?lesson=1&prompt=32&model=assistant`) keeps its generated prompt of exactly 32
    tokens, and the page says the template is not part of it."""
    from tests.app_kit import open_kitchen

    for key, value in assistant.env.items():
        monkeypatch.setenv(key, value)
    at = open_kitchen(state={"tpk_model": "assistant"})
    assert at.radio(key="tpk_mode").value == "Write a prompt"
    assert at.text_area(key="tpk_text").value == "What is the capital of France?"
    assert any("from the assistant's chat template" in c.value for c in at.caption)
    at = open_kitchen(lesson="1", prompt="32", model="assistant")
    assert at.radio(key="tpk_mode").value == "Generated prompt of N tokens"
    assert any(c.value == generated_note("assistant", 32) for c in at.caption)

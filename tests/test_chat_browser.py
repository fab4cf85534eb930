"""Chat in the Kitchen, in the browser: a learner picks the assistant in the sidebar, asks it a
question and presses Cook. The app is launched with the README's command (`two-pot-kitchen`), the
assistant already in its model cache (the suite's, converted once per session).

Checked from what the page prints: the prompt's length counts the chat template's tokens apart
from the learner's (the same counts the engine's tokenizer gives), the answer is the assistant's
reply (a real one, without the template's markers), and a generated prompt says it goes without
the template.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from engine.text import TextCodec
from tests.browser_kit import app, chromium, needs_chromium
from tests.test_browser import ARTIFACTS, COOK_TIMEOUT_MS, full_texts, wait_for_cooked

pytestmark = [pytest.mark.browser, needs_chromium]
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def server(tmp_path_factory, assistant):
    with app(tmp_path_factory.mktemp("chat"), assistant.env) as url:
        yield url


def test_choosing_the_assistant_and_cooking_a_question_answers_it(server, assistant):
    codec = TextCodec.from_folder(assistant.folder)
    chat = codec.chat_prompt([{"role": "user", "content": QUESTION}])
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1250})
        page.goto(server + "/?new=24&live=0")
        page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
        page.get_by_role("combobox", name="Model (from the catalog)").click()
        page.get_by_role("option", name="Assistant", exact=False).first.click()
        box = page.get_by_label("Your message to the assistant (every table asks it; sent in the model's chat template)")
        try:  # the assistant's order form opens on a question: its kitchen loaded, the mode set for it
            box.wait_for(timeout=COOK_TIMEOUT_MS)
        except PlaywrightTimeout:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "chat-no-question-box.png"), full_page=True)
            pytest.fail("no question box on the assistant; the page read: " + " | ".join(
                line for line in page.inner_text("body").splitlines() if line.strip())[-2000:])  # fmt: skip
        box.fill(QUESTION)
        box.press("Control+Enter")  # Streamlit commits a text area on Ctrl+Enter
        line = page.get_by_text("from the assistant's chat template")
        line.wait_for(timeout=60_000)
        counted = re.search(r"Your prompt is (\d+) tokens: (\d+) yours \+ (\d+) from the assistant's chat template",
                            line.inner_text())  # fmt: skip
        assert counted, line.inner_text()
        total, yours, template = map(int, counted.groups())
        assert (total, yours, template) == (len(chat.ids), chat.content_tokens, chat.template_tokens)
        page.get_by_role("button", name="Cook").click()
        wait_for_cooked(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "chat-assistant-answer.png"), full_page=True)
        [answer] = full_texts(page)
        assert "Paris" in answer and "<|im" not in answer and "assistant\n" not in answer, answer
        page.get_by_text("Generated prompt of N tokens").click()  # the lessons' prompt-length control
        page.get_by_text("sent without the assistant's chat template").wait_for(timeout=60_000)
        assert page.locator('[data-testid="stException"]').count() == 0

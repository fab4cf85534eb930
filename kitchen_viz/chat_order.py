"""A written prompt as the kitchen cooks it: for an instruct model, the learner's text as the user's
message in the model's own chat template; and how many of its tokens are the learner's.

Why count the template: an instruct model answers only when the question is wrapped the way it was
tuned (SmolLM2: a system turn, `<|im_start|>user ... <|im_end|>`, then `<|im_start|>assistant`), and
every token of that wrapping is prompt the wok prefills. A page that said "7 tokens" for "What is
the capital of France?" while the wok cooked 37 would misstate the wok's work; the order form says
"37 tokens: 7 yours + 30 from the assistant's chat template" instead.

The template comes from the kitchen's host (`about()["chat_template"]`, read from the model's
tokenizer when its loop loaded it) and is rendered here as the class kitchen's
/v1/chat/completions renders it (engine/chat.py `ChatTemplate`); both counts are the engine's own
tokenizer's answer to the order's check, so nothing is counted twice or by another tokenizer.

A generated prompt (the lessons' prompt-length control) is never wrapped: it is exactly N tokens of
verse cut by the engine, so its N tokens are all the wok's, and an instruct model continues it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from engine.chat import ChatTemplate
from serving.host.api import OrderForm

DEFAULT_QUESTION = "What is the capital of France?"  # the written prompt's default for an instruct model


@dataclass(frozen=True)
class PromptCount:
    """A written prompt as the kitchen cooks it (`text`), its token count, and the learner's share."""

    text: str  # what every table orders: the learner's text, or the chat template around it
    tokens: int  # the wok's tokens per table
    yours: int  # the learner's text alone, tokenized by the same engine
    model: str = ""  # whose chat template wrapped it ("" for none)

    @property
    def template_tokens(self) -> int:
        return self.tokens - self.yours

    @property
    def line(self) -> str:
        """Example: "Your prompt is 37 tokens: 7 yours + 30 from the assistant's chat template (the wok
        cooks all 37)."."""
        if not self.model:
            return f"Your prompt is {self.tokens:,} tokens."
        return (f"Your prompt is {self.tokens:,} tokens: {self.yours:,} yours + {self.template_tokens:,} from "
                f"the {self.model}'s chat template (the wok cooks all {self.tokens:,}).")  # fmt: skip


def chat_template(about: dict) -> ChatTemplate | None:
    """The kitchen's chat template from its host's `about()` (None for a model without one)."""
    spec = about.get("chat_template")
    if not spec:
        return None
    return _compiled(spec["source"], spec.get("bos_token", ""), spec.get("eos_token", ""))


@lru_cache(maxsize=8)
def _compiled(source: str, bos_token: str, eos_token: str) -> ChatTemplate:
    return ChatTemplate(source, bos_token, eos_token)  # compiled once per template, not at every rerun


def written_prompt(svc, text: str, max_new: int) -> PromptCount:
    """`text` as the kitchen `svc` (a HostClient) cooks it, checked by its engine: wrapped as the
    user's message when the model has a chat template. A refusal is the engine's EngineError line."""
    template = chat_template(svc.about)
    if template is None:
        tokens = len(svc.check(OrderForm([text], max_new)).prompt_ids[0])
        return PromptCount(text, tokens, tokens)
    wrapped = template.render([{"role": "user", "content": text}])
    tokens = len(svc.check(OrderForm([wrapped], max_new)).prompt_ids[0])  # the order itself: its limits
    yours = len(svc.check(OrderForm([text], max_new)).prompt_ids[0])  # shorter: fits wherever the order does
    return PromptCount(wrapped, tokens, yours, svc.model)


def generated_note(model: str, tokens: int) -> str:
    """What a generated prompt is on an instruct model: exactly `tokens` of verse, no template."""
    return (f"A generated prompt is exactly {tokens:,} tokens of kitchen verse, sent without the {model}'s "
            f"chat template: all {tokens:,} are the wok's, and the model continues the verse rather than "
            f"answering. Write a prompt to ask it a question.")  # fmt: skip

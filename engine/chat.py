"""A model's own chat template: messages in, the exact prompt text the model was tuned on out.

Why the model's own template: an instruct model answers well only when the conversation is spelled
the way it was during fine-tuning (SmolLM2 wraps each turn in `<|im_start|>role ... <|im_end|>`).
The template is Jinja text shipped with the tokenizer (tokenizer_config.json, chat_template.jinja,
or a GGUF's `tokenizer.chat_template`); we render it as transformers' `apply_chat_template` does:
Jinja's immutable sandbox (a template is data from a file, never trusted code), `trim_blocks` and
`lstrip_blocks`, loop controls, `raise_exception` and a `tojson` filter.

Worked example (SmolLM2-135M-Instruct), one user message "What is the capital of France?":

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    What is the capital of France?<|im_end|>
    <|im_start|>assistant

37 tokens, of which 7 are the question's own: the template adds 30 tokens of prompt the wok must
prefill too (`ChatPrompt.template_tokens`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from engine.errors import EngineError


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered conversation: its text, its token ids, and how many of them the messages' own text is."""

    text: str
    ids: list[int]
    content_tokens: int  # the messages' contents tokenized alone, summed

    @property
    def template_tokens(self) -> int:
        """Tokens the template adds (roles, turn markers, a default system prompt)."""
        return len(self.ids) - self.content_tokens


class ChatTemplate:
    """One compiled template; `render(messages)` -> the prompt text, ending where the assistant answers."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        from jinja2 import TemplateError  # lazy: jinja2 only for a model with a chat template
        from jinja2.ext import loopcontrols  # lazy: as above
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # lazy: as above

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals |= {"raise_exception": _raise, "strftime_now": lambda fmt: datetime.now().strftime(fmt)}
        try:
            self.compiled = env.from_string(source)
        except TemplateError as err:
            raise EngineError(f"the model's chat template does not compile: {err}") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        from jinja2 import TemplateError  # lazy: jinja2 only for a model with a chat template

        try:
            return self.compiled.render(messages=check_messages(messages), add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)  # fmt: skip
        except TemplateError as err:
            raise EngineError(f"the model's chat template refused these messages: {err}") from None


def check_messages(messages) -> list[dict]:
    """A conversation is a non-empty list of {"role": str, "content": str}; anything else is one line."""
    if not isinstance(messages, list | tuple) or not messages:
        raise EngineError('messages must be a non-empty list of {"role": ..., "content": ...}')
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise EngineError(f'message {i} must be {{"role": str, "content": str}}')
    return list(messages)


def chat_prompt(codec, template: ChatTemplate, messages: list[dict]) -> ChatPrompt:
    """Render and tokenize `messages`; the token count of their contents alone says what the template adds."""
    text = template.render(messages)
    return ChatPrompt(text, codec.encode(text), sum(len(codec.encode(m["content"])) for m in messages))


def _raise(message: str):
    from jinja2 import TemplateError  # lazy: as above

    raise TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

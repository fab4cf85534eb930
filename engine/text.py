"""Text in and out: the tokenizer, and streaming detokenization that never splits a character.

Why incremental detokenization is its own idea: a byte-level BPE token can carry half of a UTF-8
character (an emoji is often 2-4 tokens). Decoding each token alone would print '\ufffd' garbage,
so the stream decodes a short window of recent ids and emits only text that is complete.
Worked example: ids [A, B] decode to "caf\ufffd" after A and "café" after B: the first step
emits "" (held back: the last character is incomplete), the second emits "café".

Presets with random weights can produce ids the borrowed tokenizer does not know; those decode as a
visible placeholder like "⟨51234⟩" instead of vanishing.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import EngineError

REPLACEMENT = "\ufffd"


class TextCodec:
    """Wraps a `tokenizers.Tokenizer` (preferred) or a transformers tokenizer as fallback."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: tuple[int, ...] = ()):
        self.tok = tokenizer
        self.known = vocab_size  # ids >= known are shown as placeholders
        self.eos_ids = eos_ids
        self.chat_template: str | None = None  # Jinja text from tokenizer_config.json, if the model has one
        self.bos_token, self.eos_token = "", ""  # the special tokens' text, as chat templates name them
        self._template = None  # the compiled chat template (engine/chat.py), at the first chat_prompt

    @classmethod
    def from_folder(cls, folder: Path) -> TextCodec | None:
        """None when the folder has no tokenizer files (token-id prompts still work)."""
        if (folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer  # lazy: a model without a tokenizer never loads it

            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            codec = cls(tok, tok.get_vocab_size(with_added_tokens=True))
        elif (folder / "vocab.json").is_file() or (folder / "tokenizer.model").is_file():
            # lazy: slow-tokenizer folders only; transformers is heavy
            from transformers import AutoTokenizer  # lazy: slow-tokenizer folders only; transformers is heavy

            tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
            codec = cls(tok, len(tok))
        else:
            return None
        config, jinja = folder / "tokenizer_config.json", folder / "chat_template.jinja"
        if config.is_file():
            raw = json.loads(config.read_text())
            template = raw.get("chat_template")
            codec.chat_template = template if isinstance(template, str) else None
            codec.bos_token, codec.eos_token = _token_text(raw.get("bos_token")), _token_text(raw.get("eos_token"))
        if jinja.is_file():  # transformers 5 saves the template as a file of its own
            codec.chat_template = jinja.read_text()
        return codec

    @classmethod
    def from_transformers(cls, tok) -> TextCodec:
        """A transformers fast tokenizer (a GGUF's, engine/gguf.py): its `tokenizers` backend and chat template."""
        codec = cls(tok.backend_tokenizer, len(tok))
        template = getattr(tok, "chat_template", None)
        codec.chat_template = template if isinstance(template, str) else None
        codec.bos_token, codec.eos_token = tok.bos_token or "", tok.eos_token or ""
        return codec

    def chat_prompt(self, messages: list[dict]):
        """`messages` rendered in the model's own chat template and tokenized (engine/chat.py `ChatPrompt`:
        text, ids, and how many ids the template adds). A model without a template refuses in one line."""
        from engine.chat import ChatTemplate, chat_prompt  # lazy: jinja2 only for a model with a template

        if self.chat_template is None:
            raise EngineError("this model has no chat template; send the prompt as plain text")
        if self._template is None:
            self._template = ChatTemplate(self.chat_template, self.bos_token, self.eos_token)
        return chat_prompt(self, self._template, messages)

    def encode(self, text: str) -> list[int]:
        if hasattr(self.tok, "encode_batch"):  # tokenizers.Tokenizer
            return list(self.tok.encode(text).ids)
        return list(self.tok.encode(text))

    def _decode_known(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True) if ids else ""

    def decode(self, ids: list[int]) -> str:
        """Ids the tokenizer does not know (random presets) become a visible ⟨id⟩ placeholder."""
        out, run = [], []
        for i in ids:
            if 0 <= i < self.known:
                run.append(i)
            else:
                out += [self._decode_known(run), f"⟨{i}⟩"]
                run = []
        out.append(self._decode_known(run))
        return "".join(out)


def _token_text(value) -> str:
    """tokenizer_config.json names a special token as text or as {"content": text, ...}."""
    return value.get("content", "") if isinstance(value, dict) else value if isinstance(value, str) else ""


class IncrementalDecoder:
    """Per-sequence streaming detokenizer (the prefix/read-offset scheme vLLM uses).

    `prefix` marks where the decode window starts (a few ids back, so a leading-space marker is
    decoded in context), `read` marks the ids whose text was already emitted.
    """

    def __init__(self, codec: TextCodec | None, prompt_ids: list[int]):
        self.codec = codec
        self.ids = list(prompt_ids[-4:])  # a little context for the first token's spacing
        self.prefix, self.read = 0, len(self.ids)

    def feed(self, token_id: int, final: bool = False) -> str:
        if self.codec is None:
            return ""
        self.ids.append(token_id)
        before = self.codec.decode(self.ids[self.prefix : self.read])
        after = self.codec.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or (after.endswith(REPLACEMENT) and not final):
            return ""  # nothing printable yet (or half a character)
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]


def encode_prompts(prompts, codec: TextCodec | None) -> list[list[int]]:
    """Accept a list of strings or a list of token-id lists; return token-id lists."""
    if isinstance(prompts, str) or not isinstance(prompts, list | tuple):
        raise EngineError("prompts must be a list of strings or a list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if codec is None:
                raise EngineError("this model has no tokenizer; give prompts as token-id lists")
            out.append(codec.encode(p))
        elif isinstance(p, list | tuple) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            out.append([int(t) for t in p])
        else:
            raise EngineError(f"prompt {i + 1} is neither a string nor a list of token ids")
    return out

"""The orders the lab sends to the kitchen: prompts of an exact token length, and their limits.

Why token ids instead of text: a sweep over "prompt length 512" must feed exactly 512 tokens, and
a tokenizer turns text into an unpredictable count. So we encode a fixed passage once and tile its
ids to the length we need. Real text (not random ids) keeps the chef's attention patterns and the
sampled tokens realistic; for a throughput experiment the values matter less than the count.

Different sequences of a batch start at different offsets of the passage, so a batch is not eight
copies of one prompt (the engine could not cheat even if it wanted to).

Example:
    ids = prompt_ids(engine, 100)            # 100 token ids
    batch = batch_prompts(engine, 4, 100)    # 4 different 100-token prompts
"""

from __future__ import annotations

import torch

from engine.errors import EngineError

# A public-domain passage (Romeo and Juliet, Act II, Scene II), the chef's home cooking.
PASSAGE = """ROMEO:
He jests at scars that never felt a wound.
But, soft! what light through yonder window breaks?
It is the east, and Juliet is the sun.
Arise, fair sun, and kill the envious moon,
Who is already sick and pale with grief,
That thou her maid art far more fair than she:
Be not her maid, since she is envious;
Her vestal livery is but sick and green
And none but fools do wear it; cast it off.
It is my lady, O, it is my love!
O, that she knew she were!
She speaks yet she says nothing: what of that?
Her eye discourses; I will answer it.

JULIET:
O Romeo, Romeo! wherefore art thou Romeo?
Deny thy father and refuse thy name;
Or, if thou wilt not, be but sworn my love,
And I'll no longer be a Capulet.
"""


def passage_ids(engine) -> list[int]:
    """The passage as token ids; a model without a tokenizer gets fixed pseudo-random ids instead
    (same count every time, so timings stay comparable; the text is meaningless either way)."""
    if not getattr(engine.info, "has_tokenizer", True):
        gen = torch.Generator().manual_seed(0)
        return torch.randint(0, engine.info.vocab_size, (len(PASSAGE) // 4,), generator=gen).tolist()
    ids = list(engine.encode(PASSAGE))
    if not ids:
        raise EngineError("the tokenizer turned the lab's passage into no tokens; cannot build prompts")
    return ids


def prompt_ids(engine, length: int, offset: int = 0) -> list[int]:
    """Exactly `length` token ids, read from the passage starting at `offset` (wrapping around)."""
    if length < 1:
        raise EngineError(f"prompt length must be at least 1 token, got {length}")
    ids = passage_ids(engine)
    return [ids[(offset + i) % len(ids)] for i in range(length)]


def batch_prompts(engine, batch: int, length: int) -> list[list[int]]:
    """`batch` different prompts of `length` tokens each (each starts 7 tokens further along)."""
    if batch < 1:
        raise EngineError(f"batch must be at least 1 sequence, got {batch}")
    return [prompt_ids(engine, length, offset=7 * b) for b in range(batch)]


def mixed_prompts(engine, lengths: list[int]) -> list[list[int]]:
    """One prompt per requested length: a batch of guests who ordered different-sized dishes."""
    return [prompt_ids(engine, n, offset=7 * b) for b, n in enumerate(lengths)]


def check_fits(engine, prompt_len: int, new_tokens: int, what: str) -> None:
    """Refuse a sweep point that cannot fit the model's context, in one line naming the limit."""
    limit = engine.info.max_context
    if prompt_len + new_tokens > limit:
        raise EngineError(
            f"{what}: prompt {prompt_len} + {new_tokens} new tokens = {prompt_len + new_tokens} tokens; "
            f"the model's context is {limit}"
        )

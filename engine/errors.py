"""One exception type for every input the engine refuses.

Why one type: the CLI, the app and the lab all need to turn a refusal into a single readable line
("prompt is 2,100 tokens; the model's context is 2,048") instead of a traceback. Anything raised
as `EngineError` is a user-facing message, already phrased; anything else is a bug.
"""

import argparse


class EngineError(ValueError):
    """A refused input. `str(err)` is one line that names the problem and the limit."""

    def __init__(self, message: str):
        # Keep it to one line: callers print it as-is.
        super().__init__(" ".join(str(message).split()))


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage + error over several lines; every command of ours promises a single
    line: a malformed flag raises `EngineError`, which the command prints as its one line."""

    def error(self, message: str):
        raise EngineError(f"{self.prog}: {message}")

"""The benches' argument parser: a bad option is one line on stderr (exit 2), like every other refusal."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

"""Argument types shared by the command lines (`sprout lens`, the tuned lens' trainer, the experiments)."""
from __future__ import annotations

import argparse
from typing import Callable


def whole_number(minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum` (`--top -1` and `--threads 0` are refused, not reinterpreted)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value}")
        return value
    parse.__name__ = f"whole number >= {minimum}"
    return parse


positive = whole_number(1)

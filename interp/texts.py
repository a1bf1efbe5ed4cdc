"""Held-out text for the analyses: stories from the corpus generator, with a seed no training run uses
(`sprout.material.held_out_stories`), and hand-written everyday English that no training corpus holds.
"""
from __future__ import annotations

from importlib import resources

from sprout.material import HELD_OUT_SEED, held_out_stories

__all__ = ["HELD_OUT_SEED", "everyday_english", "held_out_stories"]


def everyday_english() -> str:
    """About 2,500 words of everyday English written by hand for this project (conversations, errands,
    news items, instructions, a letter), in no training corpus: what the demos' English is measured on."""
    return (resources.files("interp") / "everyday_english.txt").read_text(encoding="utf-8")

"""Held-out text for the analyses: stories from the corpus generator, with a seed no training run uses,
and hand-written everyday English that no training corpus holds.

The stories' names are random syllables drawn fresh for every story, so no model has seen them, and the
seed is not the one the shipped demos trained on (their recipes' `corpus_seed` is 0).
"""
from __future__ import annotations

from importlib import resources

from sprout.synthetic import generate_corpus

HELD_OUT_SEED = 20_261_129


def held_out_stories(n_chars: int, seed: int = HELD_OUT_SEED) -> str:
    """About `n_chars` characters of generated stories (whole stories), the same for the same arguments."""
    if n_chars < 1:
        raise ValueError(f"n_chars must be >= 1, got {n_chars}")
    return generate_corpus(n_chars, seed=seed)


def everyday_english() -> str:
    """About 2,500 words of everyday English written by hand for this project (conversations, errands,
    news items, instructions, a letter), in no training corpus: what the demos' English is measured on."""
    return (resources.files("interp") / "everyday_english.txt").read_text(encoding="utf-8")

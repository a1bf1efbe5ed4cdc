"""Held-out text for the analyses: stories from the corpus generator, with a seed no training run uses.

The stories' names are random syllables drawn fresh for every story, so no model has seen them, and the
seed is not the one the shipped demos trained on (their recipes' `corpus_seed` is 0).
"""
from __future__ import annotations

from sprout.synthetic import generate_corpus

HELD_OUT_SEED = 20_261_129


def held_out_stories(n_chars: int, seed: int = HELD_OUT_SEED) -> str:
    """About `n_chars` characters of generated stories (whole stories), the same for the same arguments."""
    if n_chars < 1:
        raise ValueError(f"n_chars must be >= 1, got {n_chars}")
    return generate_corpus(n_chars, seed=seed)

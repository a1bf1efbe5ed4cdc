"""Held-out text for the analyses: stories from the corpus generator, with a seed no training run uses,
and hand-written everyday English that no training corpus holds.

The stories' names are random syllables drawn fresh for every story, so no model has seen them, and the
seed is not the one the shipped demos trained on (their recipes' `corpus_seed` is 0).
"""
from __future__ import annotations

import random
from importlib import resources
from typing import Optional

from sprout.synthetic import generate_corpus, generate_story

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


def model_text(n_chars: int, seed: Optional[int] = None) -> str:
    """Stories from the generator the demo models were trained on: with seed None, the first `n_chars` of
    the demos' own training corpus (`generate_corpus(..., seed=0)`); else other, unseen stories."""
    if seed is None:
        return generate_corpus(n_chars, seed=0)
    rng, stories, total = random.Random(f"tuned-lens-{seed}"), [], 0
    while total < n_chars:
        stories.append(generate_story(rng))
        total += len(stories[-1]) + 2
    return "\n\n".join(stories)

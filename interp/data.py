"""Held-out text for the analyses: stories from the corpus generator, with a seed no training run uses
(`sprout.material.held_out_stories`), and hand-written everyday English that no training corpus holds.
"""
from __future__ import annotations

import random
from importlib import resources
from typing import Optional

from sprout.material import HELD_OUT_SEED, generate_corpus, generate_story, held_out_stories

__all__ = ["HELD_OUT_SEED", "everyday_english", "held_out_stories", "model_text"]


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

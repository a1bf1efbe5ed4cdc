"""Probe material for the analyses: held-out stories from the corpus generator, with a seed no training
run uses (`sprout.material.held_out_stories`), hand-written everyday English that no training corpus
holds, the demos' own training text, and seeded repeated random tokens (where an induction head has no
other way to do well).
"""
from __future__ import annotations

import random
from importlib import resources
from typing import Optional

import torch
from jaxtyping import Int

from sprout.material import HELD_OUT_SEED, generate_corpus, generate_story, held_out_stories, repeated_random_tokens

from ._core.inputs import slices, stream_windows
from ._core.model import HookedModel

__all__ = ["HELD_OUT_SEED", "everyday_english", "held_out_stories", "model_text", "repeated_tokens", "slices",
           "stream_windows"]


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


def repeated_tokens(model: HookedModel, half_len: int = 32, n_seqs: int = 16, token_range: Optional[tuple] = None,
                    seed: int = 0) -> Int[torch.Tensor, "n_seqs pos"]:
    """Seeded random tokens followed by the same tokens again: ids [n_seqs, 2 * half_len].

    `token_range` is (low, high), ids drawn from [low, high); the default (1, d_vocab) skips id 0
    (`<|endoftext|>` for Sprout's tokenizers).
    """
    vocab = int(model.cfg.d_vocab)
    low, high = (1, vocab) if token_range is None else token_range
    if not 0 <= low < high <= vocab:
        raise ValueError(f"token_range must satisfy 0 <= low < high <= d_vocab = {vocab}, got ({low}, {high})")
    if not 1 <= 2 * half_len <= int(model.cfg.n_ctx):
        raise ValueError(f"2 * half_len = {2 * half_len} tokens must fit the model's context of {model.cfg.n_ctx}")
    g = torch.Generator().manual_seed(seed)
    return repeated_random_tokens(n_seqs, half_len, high, g, low=low).to(model.cfg.device)

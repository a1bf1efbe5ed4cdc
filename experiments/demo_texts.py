"""The text a demo trained on and the text it did not, regenerated from its recipe.

A stories demo (`data=""`) trained on `sprout.material.generate_corpus(..., seed=corpus_seed)`; its
held-out text is `interp.held_out_stories` (names drawn at random, so no demo has seen them). An English
demo (`data="english[:sources]"`) trained on `sprout.training.english.english_corpus(...).train`; its
held-out text is every source's held-out split, in equal shares, the sources in their recipe's order.
The shipping pipeline (`experiments.ship`) trains each artifact on the first and measures it on the
second, so a lens or dictionary describes the text the model knows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import interp
from sprout.material import generate_corpus
from sprout.training.english import english_corpus, is_english, parse_data
from sprout.training.recipes import Recipe


@dataclass(frozen=True)
class DemoTexts:
    train: str  # a prefix of the model's own training text
    held_out: str  # text of the same kind it never trained on
    train_name: str  # where each comes from, in words (recorded beside what is trained on them)
    held_out_name: str


def read_recipe(folder: Path) -> Recipe:
    path = Path(folder) / "recipe.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no recipe.json, so the text it trained on is unknown")
    return Recipe.from_dict(json.loads(path.read_text()))


def demo_texts(folder: Path, train_chars: int, held_out_chars: int) -> DemoTexts:
    """The first `train_chars` of the training text and `held_out_chars` of held-out text of the model in
    `folder` (a shipped demo's folder or a run directory: wherever its recipe.json is)."""
    recipe = read_recipe(folder)
    if is_english(recipe.data):
        sources = parse_data(recipe.data)
        corpus = english_corpus(sources, recipe.story_fraction, recipe.val_fraction, recipe.corpus_seed)
        share = held_out_chars // len(corpus.val)
        held = "\n\n".join(text[:share] for text in corpus.val.values())
        return DemoTexts(corpus.train[:train_chars], held,
                         f"the first {train_chars} chars of its training text ({recipe.data}, "
                         f"{recipe.story_fraction:.0%} stories, seed {recipe.corpus_seed})",
                         f"{share} chars of each source's held-out split ({', '.join(corpus.val)})")
    if recipe.data:
        raise ValueError(f"{folder} trained on {recipe.data!r}; give its texts yourself")
    return DemoTexts(generate_corpus(train_chars, seed=recipe.corpus_seed), interp.held_out_stories(held_out_chars),
                     f"the first {train_chars} chars of its training corpus (sprout.material.generate_corpus, "
                     f"seed {recipe.corpus_seed})", f"interp.held_out_stories({held_out_chars})")

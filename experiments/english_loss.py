"""Loss per source beside the uniform and unigram baselines: `python -m experiments.english_loss [MODEL ...]`.

MODEL: a shipped demo name (default: every shipped demo), a run directory, or a run's checkpoint
(`RUN/checkpoints/step_X`); its recipe.json says what it trained on. Each model is measured on the
hand-written everyday English (`interp.everyday_english`), 20,000 characters of fresh held-out stories
and, for a model trained on `data="english"`, each source's held-out text regenerated from its recipe.
The unigram baseline is fitted on the model's training text regenerated from its recipe: a stories
demo's first `UNIGRAM_CHARS` characters of its corpus (the generator is prefix-stable), an English
model's whole training text (stories included). A text holding characters outside a character model's
vocabulary is reported as not measured.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

import interp
import sprout
from sprout.files import demo_dir, demo_names, latest_checkpoint
from sprout.material import generate_corpus
from sprout.training.english import english_corpus, is_english, parse_data
from sprout.training.recipes import Recipe

UNIGRAM_CHARS = 2_000_000


def recipe_of(name: str) -> tuple[Path, Recipe]:
    """(checkpoint, recipe) of a demo name, a run directory or a run's checkpoint."""
    path = demo_dir() / name if "/" not in name and name in demo_names() else Path(name)
    if (path / "checkpoints").is_dir():
        ckpt, run = latest_checkpoint(path), path
    else:
        ckpt, run = path, path if (path / "recipe.json").is_file() else path.parent.parent
    return ckpt, Recipe.from_dict(json.loads((run / "recipe.json").read_text()))


def texts_for(recipe: Recipe) -> tuple[str, dict[str, str]]:
    """(the training text the unigram is fitted on, the held-out texts measured)."""
    texts = {"everyday English": interp.everyday_english(), "held-out stories": interp.held_out_stories(20_000)}
    if is_english(recipe.data):
        corpus = english_corpus(parse_data(recipe.data), recipe.story_fraction, recipe.val_fraction,
                                recipe.corpus_seed)
        texts.update({f"held-out {k}": v for k, v in corpus.val.items()})
        return corpus.train, texts
    if recipe.data:
        raise ValueError(f"the recipe trains on {recipe.data!r}; give the unigram's text yourself")
    return generate_corpus(min(recipe.corpus_chars, UNIGRAM_CHARS), recipe.corpus_seed), texts


def measure(name: str) -> pd.DataFrame:
    ckpt, recipe = recipe_of(name)
    model = sprout.load(ckpt)
    train, texts = texts_for(recipe)
    rows = []
    for source, text in texts.items():
        try:
            rows.append(interp.loss_table(model, {source: text}, train))
        except ValueError as e:  # a character model's vocabulary lacks some of the text's characters
            rows.append(pd.DataFrame([dict(source=source, note=f"not measured: {str(e).splitlines()[0]}")]))
    table = pd.concat(rows, ignore_index=True)
    table.insert(0, "model", name)
    return table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.english_loss", description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help="demo names, run directories or checkpoints (default: every shipped demo)")
    args = p.parse_args(argv)
    table = pd.concat([measure(m) for m in args.models or demo_names()], ignore_index=True)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

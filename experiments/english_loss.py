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
from sprout.training.english import is_english
from sprout.training.recipes import Recipe, recipe_corpus

from . import readme

UNIGRAM_CHARS = 2_000_000
BLOCK = "english-table"  # the block `--readme` rewrites (its file: experiments.readme.HOMES)
EVERYDAY = "everyday English"
SOURCE_ORDER = ("shakespeare", "bible", "britannica", "stories")


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
    texts = {EVERYDAY: interp.everyday_english(), "held-out stories": interp.held_out_stories(20_000)}
    if is_english(recipe.data):
        corpus = recipe_corpus(recipe)
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
    table.insert(1, "unit", "character" if recipe.tokenizer == "char" else "token")
    return table


def _source(name: str) -> str:
    """"held-out shakespeare" -> "Shakespeare" (the stories keep their lower case, as in the README)."""
    name = name.removeprefix("held-out ")
    return name if name == "stories" else name[:1].upper() + name[1:]


def _order(source: str) -> tuple[int, str]:
    """The README's order: the corpus's sources as the English corpus lists them, the stories last."""
    name = source.removeprefix("held-out ")
    return (SOURCE_ORDER.index(name) if name in SOURCE_ORDER else len(SOURCE_ORDER), name)


def markdown(table: pd.DataFrame) -> str:
    """The README's table: per model, everyday English beside its baselines (the n-grams: interpolated
    Kneser-Ney fitted on the model's own training text, `interp.loss_table`), then each held-out source."""
    lines = ["| model | everyday English: loss / uniform / unigram / bigram / trigram | its held-out training text: "
             "loss / unigram / bigram |", "|---|---|---|"]
    for name, rows in table.groupby("model", sort=False):
        rows = rows.dropna(subset=["loss"]) if "loss" in rows else rows.iloc[:0]
        every = rows[rows["source"] == EVERYDAY]
        label = name + (" (characters)" if (rows["unit"] == "character").any() else "")
        first = "not measured" if every.empty else " / ".join(
            f"{every[c].iloc[0]:.2f}" for c in ("loss", "uniform", "unigram", "bigram", "trigram"))
        held = ", ".join(f"{_source(r.source)} {r.loss:.2f} / {r.unigram:.2f} / {r.bigram:.2f}" for r in
                         sorted(rows[rows["source"] != EVERYDAY].itertuples(), key=lambda r: _order(r.source)))
        lines.append(f"| {label} | {first} | {held} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.english_loss", description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help="demo names, run directories or checkpoints (default: every shipped demo)")
    p.add_argument("--readme", default=None, metavar="README", help=f"rewrite the table of this file's {BLOCK} block")
    args = p.parse_args(argv)
    if args.readme:  # a README without the block is one line, before minutes of measuring
        readme.block(readme.read(args.readme), BLOCK)
    table = pd.concat([measure(m) for m in args.models or demo_names()], ignore_index=True)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.readme:
        readme.rewrite(args.readme, BLOCK, markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

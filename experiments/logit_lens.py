"""The logit lens: read the residual stream after every block through the final norm and unembedding."""
from __future__ import annotations

import sys

import pandas as pd

import figures
import interp

from .common import LENS_TEXT, SETTINGS, chapter_model, fit_text, folder_of, held_out_text, number, positive, standalone

NAME = "logit_lens"
DOC = "Logit-lens grid for a text, and the lens' mean confidence per layer on held-out text."
SUMMARY = ("What each model would predict if it stopped after each block: the top-1 token per layer and "
           "position, coloured by its probability and framed where it is the actual next token.")
TEXT = LENS_TEXT
MAX_TOKENS = 64
DOC_TOKENS = 20  # the README's copy of the grid: the first tokens only


def add_args(p):
    p.add_argument("--chars", type=positive, default=SETTINGS.held_out_chars, help="characters of held-out text for the per-layer summary")


def run(models, out, args) -> list[dict]:
    rows, summaries = [], []
    for label, model in models.items():
        lens = interp.logit_lens(model, fit_text(model, args.text, MAX_TOKENS), k=5)
        out.table(lens.drop(columns=["top_ids"]), f"lens_{label}")
        out.figure(figures.logit_lens_grid(lens, title=f"Logit lens, {label}"), f"lens_{label}",
                   f"{label}: the top-1 token after each block; frames mark the actual next token; hover for the top 5.")
        short = lens[lens["pos"] < DOC_TOKENS]  # a README-sized grid
        out.extra[f"lens_{label}_short"] = figures.logit_lens_grid(short, title=f"Logit lens, {label}")
        summary = interp.lens_dataset_summary(model, held_out_text(model, args.chars, folder_of(models, label))).assign(model=label)
        summaries.append(summary)
        conf = summary.set_index("layer")["mean_top1_prob"]
        last = int(conf.index.max())
        # the chapter's numbers are the 8-block Sprout's (on its three texts): 77% after block 7, 59% after 8;
        # shown beside the models the chapter measured only (one's own 2-block model gets no chapter column)
        ch = chapter_model(label)
        if last >= 2:
            rows.append(number(f"mean top-1 probability after block {last - 1}", float(conf[last - 1]),
                               "77% (Sprout, after block 7 of 8)" if ch else None, label, fmt="{:.0%}"))
        rows.append(number(f"mean top-1 probability after block {last} (output)", float(conf[last]),
                           "59% (Sprout, after block 8 of 8)" if ch else None, label, fmt="{:.0%}"))
        hit = summary.set_index("layer")["frac_next_top1"]
        rows.append(number("next token is top-1 at the output", float(hit[last]), None, label, fmt="{:.0%}"))
        rows.append(number("where the lens is most confident (mean top-1 probability)", confident_at(conf), None, label))
    out.table(pd.concat(summaries, ignore_index=True), "lens_summary")
    return rows


def confident_at(conf: pd.Series) -> str:
    """The layer with the highest mean top-1 probability, named; the embedding is called what it is (its
    confidence is that of the bigram table the tied embedding reads, not of any block)."""
    best, last = int(conf.idxmax()), int(conf.index.max())
    where = ("the embedding (before any block: the tied embedding read as a bigram table)" if best == 0 else
             f"after block {best}" + (" (the output)" if best == last else ""))
    return f"{where}, {conf[best]:.0%}"


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

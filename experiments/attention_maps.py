"""Attention patterns on a text with a repeated name: every head of every layer, and the top heads."""
from __future__ import annotations

import sys

import pandas as pd

import figures
import interp

from .common import ZORBIN, fit_text, head_scores, number, standalone

NAME = "attention_maps"
DOC = "Attention heatmaps (string tokens on both axes) for every layer's heads and for the top heads."
SUMMARY = ("Where each head looks, on a text in which a name comes back: a previous-token head makes a "
           "line just below the diagonal, an induction head a line from the second occurrence to the "
           "token after the first.")
TEXT = ZORBIN
MAX_TOKENS = 64


def run(models, out, args) -> list[dict]:
    rows, tables = [], []
    for label, model in models.items():
        text = fit_text(model, args.text, MAX_TOKENS)
        pat = interp.attention_patterns(model, text)
        tables.append(pat.assign(model=label))
        rows.append(number("tokens of the text drawn", int(pat["query_pos"].max()) + 1, None, label))
        for layer in sorted(pat["layer"].unique()):
            out.figure(figures.attention_grid(pat, layer=int(layer), title=f"Attention, {label}"),
                       f"grid_{label}_layer{int(layer)}", f"{label}, layer {int(layer)}: every head's pattern on the text.")
        for kind in ("previous_token", "induction"):
            # the head and score head_detection reports (one call, one set of settings: the page states
            # each number once, there); this experiment only draws the head
            best = head_scores(model, kind).iloc[0]
            l, h = int(best.layer), int(best['head'])
            name = interp.Head(l, h).label
            out.figure(figures.attention_heatmap(pat, l, h, title=f"Top {kind.replace('_', '-')} head of {label} (score {best.score:.2f})"),
                       f"{kind}_{label}", f"{label}: the head with the highest {kind.replace('_', '-')} score "
                       f"(head detection's), {name} ({best.score:.2f}), on the text.")
    out.table(pd.concat(tables, ignore_index=True), "patterns")
    return rows


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

"""How big the residual stream gets: its RMS per token after the embedding and after every block."""
from __future__ import annotations

import sys

import pandas as pd

import figures
import interp

from .common import SETTINGS, folder_of, held_out_text, number, positive, standalone

NAME = "residual_growth"
DOC = "Residual-stream RMS against depth on held-out text, several models on one plot."
SUMMARY = ("Blocks only add to the stream, so it grows: the RMS of a token's vector right after the "
           "embedding, after each attention and after each block, on held-out text (log scale).")
# The chapter's gpt-4, on held-out text: about 0.18, about 10 after block 1, about 35 after block 4.
CHAPTER = {0: "0.18", 1: "~10", 4: "~35"}


def add_args(p):
    p.add_argument("--chars", type=positive, default=SETTINGS.held_out_chars, help="characters of held-out text per model")


def run(models, out, args) -> list[dict]:
    frames, rows = [], []
    for label, model in models.items():
        df = interp.residual_rms(model, held_out_text(model, args.chars, folder_of(models, label))).assign(model=label)
        frames.append(df)
        stream = df[df["kind"] == "stream"].set_index("layer")["mean"]
        last = int(max(l for l in stream.index if float(l).is_integer()))
        ch = label == "gpt-4"
        rows += [
            number("RMS after the embedding", float(stream[0]), CHAPTER[0] if ch else None, label),
            number("RMS after block 1", float(stream[1]), CHAPTER[1] if ch else None, label),
            number(f"RMS after block {last} (the last)", float(stream[last]), CHAPTER[4] if ch and last == 4 else None, label),
            number("growth, last block / embedding", float(stream[last] / stream[0]), "~200x" if ch else None, label,
                   fmt="{:.0f}x"),
        ]
    table = pd.concat(frames, ignore_index=True)
    out.table(table, "residual_rms")
    out.figure(figures.residual_rms(table[table["kind"] == "stream"]), "residual_rms",
               "RMS of the residual stream per token against depth; line = mean, band = 5th-95th percentile of tokens.")
    return rows


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

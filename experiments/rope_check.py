"""RoPE: the query-key score depends only on the distance m - n, not on where the pair stands."""
from __future__ import annotations

import sys

import figures
import interp

from .common import number, standalone

NAME = "rope_check"
DOC = "The chapter's RoPE check with Sprout's own rotation code, over many positions."
SUMMARY = ("One random query and key (d_head 64), rotated by Sprout's RoPE to positions m and n: along each "
           "line only the absolute position changes, and the score stays the same.")
NEEDS_MODELS = False
DISTANCES = (0, 1, 3, 10, 50)


def run(models, out, args) -> list[dict]:
    chapter = interp.rope_distance_check()  # (5, 2), (105, 102), (400, 397), (5, 4)
    sweep = interp.rope_distance_check(positions=[(m, m - d) for d in DISTANCES for m in range(d, 512, 16)])
    out.table(chapter, "chapter_pairs")
    out.table(sweep, "sweep")
    out.figure(figures.rope_distance(sweep), "rope_distance",
               "The score of the same query and key at many positions; each flat line is one distance m - n.")
    s = chapter.set_index(["m", "n"])["score"]
    return [
        number("q.k at (5, 2), (105, 102), (400, 397)", f"{s[5, 2]:+.4f}, {s[105, 102]:+.4f}, {s[400, 397]:+.4f}",
               "equal (the same distance)"),
        number("q.k at (5, 4)", float(s[5, 4]), "different (distance 1)", fmt="{:+.4f}"),
        number("largest spread of the score at a fixed distance", float(sweep["spread"].max()), "0", fmt="{:.1e}"),
        number("|rope(q, m)| / |q|, furthest from 1", float((sweep["norm_ratio"] - 1).abs().max() + 1), "1 (length kept)",
               fmt="{:.6f}"),
    ]


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

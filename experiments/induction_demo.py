"""The chapter's "Zorbin Plax" table: a name seen once is copied the second time, given enough blocks."""
from __future__ import annotations

import sys

import figures
import interp
from interp.cli import whole_number

from .common import SETTINGS, ZORBIN, number, standalone

NAME = "induction_demo"
DOC = "Per-token probability of a repeated invented name at its first and second occurrence, per model."
SUMMARY = ("The probability each model gives each token of an invented name the first time it appears "
           "(unpredictable) and the second time (copyable from the context); below it the same averaged "
           "over generated stories whose names no model has seen.")
TEXT = ZORBIN


def add_args(p):
    p.add_argument("--name", default="Zorbin Plax", help="the repeated name in --text")
    p.add_argument("--stories", type=whole_number(0), default=SETTINGS.stories, help="generated stories to average over (0: skip)")


def run(models, out, args) -> list[dict]:
    table = interp.induction_table(models, args.text, args.name)
    out.table(table, "induction_table")
    out.figure(figures.induction_table(table, title=f'Copying "{args.name}"'), "induction_table",
               f'Each token of "{args.name}": its probability at the first and at the second occurrence, per model.')
    rows = []
    for label in models:
        t = table[(table["model"] == label) & (table["occurrence"] == 2)].set_index("token_index")
        chapter = {"gpt-1": ("below 1% on \"or\"", None), "gpt-4": ("98% on \"or\"", "93% on \"bin\"")}.get(label, (None, None))
        for i, ch in ((1, chapter[0]), (2, chapter[1])):
            if i in t.index:
                rows.append(number(f'p({t.loc[i, "token"]!r}) at the 2nd "{args.name}"', float(t.loc[i, "prob"]), ch,
                                   label, fmt="{:.1%}"))
    if args.stories:
        stories = interp.induction_stories(models, n_stories=args.stories, seed=SETTINGS.seed)
        out.table(stories, "induction_stories")
        out.figure(figures.induction_table(stories, prob="mean_prob",
                                           title=f"Copying unseen names, mean over {args.stories} stories"),
                   "induction_stories", "The same, averaged over the names of generated stories: token k of a "
                   "name at its first and at its later occurrences.")
        later = stories[(stories["occurrence"] == "later") & (stories["token_index"] >= 1)]
        for label, g in later.groupby("model", sort=False):
            mean = float((g["mean_prob"] * g["n"]).sum() / g["n"].sum())
            rows.append(number("mean p(name token 2+) at later occurrences, stories", mean, None, label, fmt="{:.1%}"))
    return rows


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

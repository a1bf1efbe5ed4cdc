"""Which heads are previous-token, duplicate-token, induction and prefix-matching heads, and do they matter."""
from __future__ import annotations

import sys

import pandas as pd

import figures
import interp

from .common import SETTINGS, half_len, head_scores, number, positive, standalone

NAME = "head_detection"
DOC = "Head scores for every detector on repeated random tokens, and the loss change when the top heads are ablated."
SUMMARY = ("Each head scored by how much it attends where a previous-token, duplicate-token, induction or "
           "prefix-matching head would (on seeded random tokens repeated twice); then the top induction "
           "heads are removed to see whether the loss on the repeat actually depends on them.")


def add_args(p):
    p.add_argument("--top", type=positive, default=SETTINGS.top, help="how many top induction heads to ablate")
    p.add_argument("--n-seqs", type=positive, default=SETTINGS.n_seqs, help="random sequences (each repeated once)")


def scores_for(model, n_seqs: int) -> dict:
    return {kind: head_scores(model, kind, n_seqs) for kind in interp.heads.SCORE_KINDS}


def repeat_rows(model, label: str, n_seqs: int) -> list[dict]:
    """Loss on each copy of the repeated random tokens, beside the uniform guess."""
    rep = interp.repeat_loss(model, half_len=half_len(model), n_seqs=n_seqs, seed=SETTINGS.seed).set_index("copy")
    note = "first copies are never trained on (the induction curriculum masks them), so this can exceed the uniform guess"
    return [number("repeated random tokens: loss on the 1st copy (nats/token)", float(rep.loc["first", "loss"]), None,
                   label, fmt="{:.2f}", note=note),
            number("repeated random tokens: loss on the 2nd copy (nats/token)", float(rep.loc["second", "loss"]), None,
                   label, fmt="{:.2f}"),
            number("uniform guess over the ids drawn, ln(n)", float(rep.loc["first", "uniform"]), None, label, fmt="{:.2f}")]


def run(models, out, args) -> list[dict]:
    rows, all_scores, all_abl = [], [], []
    for label, model in models.items():
        scores = scores_for(model, args.n_seqs)
        all_scores += [s.assign(model=label) for s in scores.values()]
        out.figure(figures.head_scores(scores, title=f"Head scores, {label}"), f"scores_{label}",
                   f"{label}: every head's score for each detector (layer x head), on repeated random tokens.")
        ind = scores["induction"]
        top = [(int(l), int(h)) for l, h in zip(ind["layer"][: args.top], ind["head"][: args.top])]
        abl = pd.concat([interp.ablate_heads(model, top, method=m, half_len=half_len(model), n_seqs=args.n_seqs,
                                             seed=SETTINGS.seed)
                         for m in ("zero", "mean")], ignore_index=True)
        all_abl.append(abl.assign(model=label))
        out.figure(figures.ablation_bars(abl, title=f"Ablating the top induction heads, {label}"), f"ablation_{label}",
                   f"{label}: the loss on the repeated half when the top {len(top)} induction heads are "
                   "zeroed or set to their mean, one at a time and together.")
        best, prev = ind.iloc[0], scores["previous_token"].iloc[0]
        zero = abl[abl["method"] == "zero"].set_index("label")
        first = interp.Head(int(best.layer), int(best["head"])).label
        ch = label == "gpt-4"
        rows += [
            number("top induction head (score)", f"{first} ({best.score:.2f})",
                   "an induction head in layer 3 (of 4)" if ch else None, label),
            number("top previous-token head (score)", f"{interp.Head(int(prev.layer), int(prev['head']))} ({prev.score:.2f})",
                   "a previous-token head in layer 2 (of 4)" if ch else None, label),
            number(f"loss change, {first} zero-ablated (nats/token)", float(zero.loc[first, "delta"]), None, label,
                   fmt="{:+.3f}"),
            number(f"loss change, top {len(top)} zero-ablated together", float(zero["delta"].iloc[-1]), None, label,
                   fmt="{:+.3f}"),
        ] + repeat_rows(model, label, args.n_seqs)
    out.table(pd.concat(all_scores, ignore_index=True), "head_scores")
    out.table(pd.concat(all_abl, ignore_index=True), "ablation")
    return rows


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

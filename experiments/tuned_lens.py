"""The tuned lens beside the logit lens: both grids for one text, and per-layer KL / cross-entropy on held-out text.

Loads each model's shipped lens (or the one beside its checkpoint); it never trains one (that is
`python -m interp.lens.train`). A model without a lens is listed and skipped.
"""
from __future__ import annotations

import sys

import pandas as pd

import figures
import interp

from .common import LENS_TEXT, fit_text, folder_of, held_out_text, number, positive, standalone

NAME = "tuned_lens"
DOC = "Logit lens and tuned lens side by side, and their per-layer KL to the output on held-out text."
SUMMARY = ("The tuned lens (Belrose et al. 2023) reads each layer through a learned affine translator before the "
           "final norm and unembedding. Beside the logit lens: the top-1 grids for the same text, and how far each "
           "layer's reading is from the model's output (KL) and from the actual next token (cross-entropy) on "
           "held-out text.")
TEXT = LENS_TEXT
MAX_TOKENS = 64
DOC_TOKENS = 20


def add_args(p):
    p.add_argument("--chars", type=positive, default=4_000, help="characters of held-out text for the per-layer curves")


def find_lens(model, folder=None):
    """The lens in the model's `folder` (beside its checkpoint), else the shipped one for these weights, else None."""
    for where in ([folder] if folder is not None else []) + [None]:
        try:
            return interp.load_tuned_lens(model, where)
        except FileNotFoundError:
            continue
    return None


def _numbers(label: str, cmp: pd.DataFrame) -> list[dict]:
    by = {name: g.groupby("layer")[["kl_to_final", "cross_entropy", "top1_agreement"]].mean()
          for name, g in cmp.groupby("lens")}
    last = int(cmp.layer.max())
    rows = []
    for layer in sorted({0, max(last - 1, 0)}):
        where = "embedding" if layer == 0 else f"after block {layer}"
        for name in ("logit", "tuned"):
            rows.append(number(f"held-out KL to the output, {where}, {name} lens (nats)",
                               float(by[name].kl_to_final[layer]), None, label, fmt="{:.2f}"))
        rows.append(number(f"top-1 agreement with the output, {where}, logit / tuned",
                           f"{by['logit'].top1_agreement[layer]:.0%} / {by['tuned'].top1_agreement[layer]:.0%}", None, label))
    lower = all(by["tuned"].kl_to_final[l] < by["logit"].kl_to_final[l] for l in range(last))
    rows.append(number("tuned lens below the logit lens at every layer before the output", "yes" if lower else "no",
                       None, label))
    if "unigram" in by:
        rows.append(number("layers where the tuned lens' next-token CE beats the unigram (a constant), held-out text",
                           wins(by["tuned"].cross_entropy, by["unigram"].cross_entropy, last), None, label))
        rows.append(number("layers where the logit lens' next-token CE beats the unigram, held-out text",
                           wins(by["logit"].cross_entropy, by["unigram"].cross_entropy, last), None, label))
    return rows


def wins(a: pd.Series, b: pd.Series, last: int) -> str:
    """Which layers (0 = the embedding) before the output have a below b, as text."""
    won = [l for l in range(last) if a[l] < b[l]]
    if len(won) == last:
        return f"all {last} (embedding included)"
    return (", ".join("embedding" if l == 0 else f"block {l}" for l in won) or "none") + f" of {last}"


def _repeated(model, lens, label: str) -> tuple[list[dict], pd.DataFrame]:
    """Where the tuned lens loses to the logit lens: on repeated random tokens (the lens was fitted on
    stories), per layer."""
    ids = interp.repeated_tokens(model, half_len=min(32, int(model.cfg.n_ctx) // 2), n_seqs=8, seed=0)
    cmp = interp.lens_comparison(model, ids, lens)
    by = {name: g.set_index("layer") for name, g in cmp.groupby("lens")}
    last = int(cmp.layer.max())
    rows = [number("layers where the tuned lens is closer to the output (KL) than the logit lens, repeated random tokens",
                   wins(by["tuned"].kl_to_final, by["logit"].kl_to_final, last), None, label),
            number("layers where the tuned lens' next-token CE beats the logit lens', repeated random tokens",
                   wins(by["tuned"].cross_entropy, by["logit"].cross_entropy, last), None, label)]
    return rows, cmp


def run(models, out, args) -> list[dict]:
    rows, tables, repeated_tables = [], [], []
    for label, model in models.items():
        folder = folder_of(models, label)
        lens = find_lens(model, folder)
        if lens is None:
            rows.append(number("tuned lens", "none shipped or beside the checkpoint", None, label))
            continue
        text = fit_text(model, args.text, MAX_TOKENS)
        logit, tuned = interp.logit_lens(model, text, k=5), interp.tuned_lens(model, text, lens, k=5)
        out.figure(figures.lens_side_by_side(logit, tuned, title=f"{label}"), f"side_by_side_{label}",
                   f"{label}: the logit lens (top) and the tuned lens (bottom) on the same text; frames mark the actual next token.")
        short = (logit[logit.pos < DOC_TOKENS], tuned[tuned.pos < DOC_TOKENS])
        out.extra[f"side_by_side_{label}_short"] = figures.lens_side_by_side(*short, title=f"{label}")
        cmp = interp.lens_comparison(model, held_out_text(model, args.chars, folder), lens, by_seq=True)
        out.figure(figures.lens_comparison_curves(cmp, title=label), f"curves_{label}",
                   f"{label}: KL to the output and next-token cross-entropy per layer, logit vs tuned lens, on held-out text.")
        tables.append(cmp.assign(model=label))
        rows += _numbers(label, cmp)
        repeated_rows, repeated = _repeated(model, lens, label)
        rows += repeated_rows
        repeated_tables.append(repeated.assign(model=label))
        rows.append(number("lens trained for", f"{lens.info.get('steps')} steps, {lens.info.get('data', '?')}", None, label))
    if tables:
        cmp = pd.concat(tables, ignore_index=True)
        out.table(cmp, "comparison")
        (out.dir / "comparison.md").write_text(markdown(cmp) + "\n", encoding="utf-8")
        repeated = pd.concat(repeated_tables, ignore_index=True)
        out.table(repeated, "comparison_repeated")
        (out.dir / "comparison_repeated.md").write_text(markdown(repeated) + "\n", encoding="utf-8")
    return rows


def markdown(cmp: pd.DataFrame) -> str:
    """The README's table: per model and layer, held-out KL, cross-entropy and top-1 agreement, logit / tuned."""
    m = cmp.groupby(["model", "lens", "layer"], sort=False)[["kl_to_final", "cross_entropy", "top1_agreement"]].mean()
    uni = "unigram" in set(cmp["lens"])
    names = "logit / tuned / unigram" if uni else "logit / tuned"
    lines = [f"| model | layer | KL to output, {names} (nats) | next-token CE, {names} (nats) "
             f"| top-1 = output's, {names} |",
             "| --- | --- | ---: | ---: | ---: |"]
    for model in cmp.model.unique():
        layers = sorted(cmp[cmp.model == model].layer.unique())
        for layer in layers:
            rows = [m.loc[(model, lens, layer)] for lens in (("logit", "tuned", "unigram") if uni else ("logit", "tuned"))]
            where = "embedding" if layer == 0 else (f"after block {layer}" + (" = output" if layer == layers[-1] else ""))
            cells = [" / ".join(f.format(getattr(r, col)) for r in rows)
                     for col, f in (("kl_to_final", "{:.2f}"), ("cross_entropy", "{:.2f}"), ("top1_agreement", "{:.0%}"))]
            lines.append(f"| {model} | {where} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

"""The feature pages' HTML: `features/<model>.html` and `features/<model>/<dictionary>.html`, rendered from
experiments/templates/features_*.html.j2 (autoescaped, `experiments.pages`). This module turns a
`feature_report` and its held-out scores into plain values for those templates; only the plotly divs are
inserted as HTML."""
from __future__ import annotations

import figures.features as ff

from .common import figure_div
from .feature_text import token_label, whole_words
from .pages import markup, render


def _figure(fig, div_id: str):
    # The one place these pages take HTML as it is: plotly writes the div and its script, and JSON-encodes
    # every string in the figure with "<" as \u003c, so no text in a figure (a token, a title) can open a tag.
    return markup(figure_div(fig, div_id))


def context_tokens(ctx, model=None, rows=None) -> list[dict]:
    """One context cut at whole words, as the template's tokens: `text` (whitespace-only tokens and byte
    pieces made visible, `feature_text.token_label`), `alpha` (its activation over the example's peak,
    clipped to [0, 1]: its shade), `act` (its activation) and `peak` (the token the example is about)."""
    ctx = whole_words(ctx)
    top = max(float(ctx.example_max.iloc[0]), 1e-9)
    return [dict(text=token_label(model, int(rows[row][pos]), tok) if rows is not None else tok,
                 alpha=min(max(act / top, 0.0), 1.0), act=float(act), peak=bool(off == 0))
            for tok, act, off, row, pos in zip(ctx.token_str, ctx.activation, ctx.offset, ctx.row, ctx.pos)]


def visible_effects(model, effects):
    """Logit effects with each token label made visible (byte pieces as their bytes)."""
    return effects.assign(token_str=[token_label(model, t, s) for t, s in zip(effects.token, effects.token_str)])


def dictionary_page(label: str, model_label: str, rep, js: str, scores=None, model=None, rows=None) -> str:
    """One dictionary's page: its shown latents ordered by held-out AUROC (`scores`: interpretability_score's
    rows for them), each with its contexts, histogram and logit effects. `rows`: the token windows the
    report's contexts index (their ids make byte pieces visible)."""
    t = rep.table
    held = {} if scores is None else {int(r.index): r for r in scores[scores.source == "dictionary"].itertuples()}
    shown = t[t.shown].assign(auroc=lambda f: [getattr(held.get(j), "auroc", float("nan")) for j in f.latent])
    shown = shown.sort_values("auroc", ascending=False, na_position="last")
    effects = visible_effects(model, rep.logit_effects) if model is not None else rep.logit_effects
    latents = [dict(latent=int(r.latent), density=float(r.density), mean_act=float(r.mean_act), max_act=float(r.max_act),
                    summary=str(r.summary), held=held.get(r.latent),
                    contexts=[context_tokens(ex, model, rows)
                              for _, ex in rep.contexts[rep.contexts.latent == r.latent].groupby("example")],
                    card=_figure(ff.feature_card(rep.histograms, effects, r.latent, f"latent {r.latent}"), f"card{r.latent}"))
               for r in shown.itertuples()]
    return render("features_dictionary.html.j2", title=f"{model_label}: {label}", js=js, model_label=model_label,
                  n_latents=len(t), n_fired=int((t.density > 0).sum()), latents=latents,
                  overview=_figure(ff.feature_overview(t, label), "overview"))


def model_page(model_label: str, dictionaries: list[dict], js: str) -> str:
    """A model's page listing its dictionaries: each a dict of `label`, `file` (its page, in the folder
    named after the model), `kind`, `metrics` and `score` (plain text, `metrics_text` and `score_text`)."""
    return render("features_model.html.j2", title=f"{model_label}: features", js=js, model_label=model_label,
                  dictionaries=dictionaries)


def kind_text(sae) -> str:
    """A dictionary's kind and size, e.g. "topk, d_sae 512, k 16"."""
    return f"{sae.kind}, d_sae {sae.d_sae}{f', k {sae.k}' if sae.k else ''}"


def metrics_text(sae) -> str:
    """The held-out metrics a dictionary was shipped with, as one line of text."""
    held = (sae.info or {}).get("held_out") or {}
    keys = [("explained_variance", "EV {:.3f}"), ("ev_margin", "({:+.3f} over the best baseline)"),
            ("ce_loss_recovered", "CE rec. {:.3f}"), ("ce_loss_recovered_mean", "CE rec. against mean ablation {:.3f}"),
            ("l0", "L0 {:.1f}"), ("dead_fraction", "dead {:.1%}")]
    return ", ".join(f.format(held[k]) for k, f in keys if isinstance(held.get(k), (int, float)))


def score_text(summary) -> str:
    """The interpretability score of a dictionary beside PCA and random directions (share with AUROC >= 0.8)."""
    share = dict(zip(summary.source, summary.share_good))
    return " / ".join(f"{share[k]:.0%}" if k in share else "–" for k in ("dictionary", "pca", "random"))

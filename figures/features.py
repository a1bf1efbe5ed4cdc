"""A dictionary's latents: an overview of all of them, and one card per latent (activations, logit effects).

Built from `interp.saes.features.feature_report`'s frames; the token-shaded contexts are HTML, written by
the page (`experiments.features`), since text reads better as text than as a plot.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import PALETTE, base_layout, escape_token, require

TABLE_COLUMNS = ["latent", "density", "mean_act", "shown", "summary"]
HIST_COLUMNS = ["latent", "lo", "hi", "count"]
EFFECT_COLUMNS = ["latent", "direction", "rank", "token_str", "effect"]
WIDTH = 1000  # px: inside a 1400 px window with the page's margins


def feature_overview(table: pd.DataFrame, title: str = "Latents", shown_label: str = "shown below") -> go.Figure:
    """Every live latent as a point: how often it fires (log density) against its mean activation.

    Args:
        table: `FeatureReport.table` (one row per latent; `shown` ones are drawn larger, with their summary
            on hover).
        shown_label: the legend's name for the shown latents (where the figure's reader finds them).
    """
    require(table, TABLE_COLUMNS, "feature_overview")
    live = table[table.density > 0]
    dead = int((table.density == 0).sum())
    traces = [go.Scatter(
        x=np.log10(g.density), y=g.mean_act, mode="markers", name=shown_label if shown else "other latents",
        marker=dict(size=9 if shown else 5, color=PALETTE[1] if shown else PALETTE[0], opacity=0.9 if shown else 0.45),
        customdata=np.stack([g.latent, g.density, [escape_token(s) for s in g.summary]], -1),
        hovertemplate="latent %{customdata[0]}<br>density %{customdata[1]:.2%}<br>mean activation %{y:.3g}"
                      "<br>%{customdata[2]}<extra></extra>") for shown, g in live.groupby("shown")]
    layout = base_layout(title, f"{len(live)} live latents, {dead} dead (never fired on this text)",
                         width=WIDTH, height=420, margin=dict(l=70, r=30, t=80, b=60),
                         xaxis=dict(title="density: fraction of tokens the latent fires on (log10)"),
                         yaxis=dict(title="mean activation when firing"),
                         legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    fig = go.Figure(data=traces, layout=layout)
    return fig


def feature_card(histograms: pd.DataFrame, effects: pd.DataFrame, latent: int, title: str = "") -> go.Figure:
    """One latent: the histogram of its nonzero activations, and the tokens its decoder row promotes and
    suppresses (`W_dec @ W_U`, logit per unit of activation).

    Args:
        histograms: `FeatureReport.histograms`; effects: `FeatureReport.logit_effects` (or `logit_effects`).
    """
    require(histograms, HIST_COLUMNS, "feature_card (histograms)")
    require(effects, EFFECT_COLUMNS, "feature_card (logit effects)")
    h = histograms[histograms.latent == latent].sort_values("lo")
    e = effects[effects.latent == latent]
    if e.empty:
        raise ValueError(f"feature_card: no logit effects for latent {latent}")
    centre = np.sqrt(h.lo.clip(lower=1e-4) * h.hi)
    order = pd.concat([e[e.direction == "bottom"].sort_values("rank", ascending=False),
                       e[e.direction == "top"].sort_values("rank", ascending=False)])
    labels = [f"{escape_token(t)} " for t in order.token_str]
    hist = go.Bar(x=centre, y=h["count"], width=(h.hi - h.lo.clip(lower=1e-4)) * 0.95, marker_color=PALETTE[0],
                  customdata=np.stack([h.lo, h.hi], -1) if len(h) else None, showlegend=False, xaxis="x", yaxis="y",
                  hovertemplate="%{customdata[0]:.3g} .. %{customdata[1]:.3g}: %{y} tokens<extra></extra>")
    bars = go.Bar(x=order.effect, y=list(range(len(order))), orientation="h", showlegend=False, xaxis="x2", yaxis="y2",
                  marker_color=[PALETTE[2] if d == "top" else PALETTE[1] for d in order.direction],
                  customdata=labels, hovertemplate="%{customdata}: %{x:+.3f}<extra></extra>")
    # one Figure built at once (make_subplots and update_* re-validate the layout each time: 10x slower)
    height = max(300, 22 * len(order) + 120)
    titles = [dict(text=t, x=x, y=1.0, xref="paper", yref="paper", xanchor="center", yanchor="bottom", showarrow=False)
              for t, x in (("nonzero activations", 0.2), ("logit effect per unit of activation", 0.78))]
    grid = dict(gridcolor="#e5e5e5", zerolinecolor="#bbb")
    layout = {**base_layout(title or f"latent {latent}", width=WIDTH, height=height, margin=dict(l=60, r=30, t=80, b=50),
                            bargap=0.05, annotations=titles, plot_bgcolor="white",
                            xaxis=dict(domain=[0, 0.4], type="log", title="activation", **grid),
                            yaxis=dict(title="tokens", **grid), xaxis2=dict(domain=[0.58, 1], title="logit", anchor="y2", **grid),
                            yaxis2=dict(anchor="x2", tickvals=list(range(len(order))), ticktext=labels, **grid)),
              "template": None}  # a page draws dozens of cards: a named template costs 15x the rest of a card
    fig = go.Figure(data=[hist, bars], layout=layout)
    return fig


FRONTIER_COLUMNS = ["dictionary", "method", "l0", "explained_variance", "ce_loss_recovered_mean"]


def frontier_figure(table: pd.DataFrame, title: str = "EV and CE recovered against L0") -> go.Figure:
    """Held-out explained variance (left) and CE loss recovered against mean ablation (right) against L0: one
    line per dictionary and method (the dictionary solid, its baselines dotted), points sorted by L0. A dense
    baseline (least-squares regression: L0 = d_model, far right of every sparse point) is drawn as a level
    line across the sparse points' L0 range, so it does not squash the axis.

    Args:
        table: rows of `experiments.frontier.frontier` (`dictionary`, `method`, `l0`, `explained_variance`,
            `ce_loss_recovered_mean`).
    """
    require(table, FRONTIER_COLUMNS, "frontier_figure")
    traces = []
    names = list(dict.fromkeys(table.dictionary))
    sparse = table[table.method != "regression"].l0
    span = [float(sparse.min()), float(sparse.max())] if len(sparse) else [0.0, 1.0]
    for (dictionary, method), g in table.groupby(["dictionary", "method"], sort=False):
        g = g.sort_values("l0")
        dense = method == "regression"
        color = PALETTE[names.index(dictionary) % len(PALETTE)]
        line = dict(color=color, dash="solid" if method == "dictionary" else "dot")
        label = f"{dictionary}: {method}" + (f" (dense, L0 {g.l0.iloc[0]:.0f})" if dense else "")
        for col, axes in (("explained_variance", ("x", "y")), ("ce_loss_recovered_mean", ("x2", "y2"))):
            x, y = (span, [float(g[col].mean())] * 2) if dense else (g.l0, g[col])
            traces.append(go.Scatter(x=x, y=y, mode="lines" if dense else "lines+markers", line=line, xaxis=axes[0],
                                     yaxis=axes[1], name=label, legendgroup=f"{dictionary}{method}",
                                     showlegend=col == "explained_variance",
                                     hovertemplate=f"{label}<br>L0 %{{x:.1f}}: %{{y:.3f}}<extra></extra>"))
    layout = base_layout(title, width=WIDTH, height=420 + 22 * len(traces) // 2, margin=dict(l=60, r=30, t=80, b=60),
                         xaxis=dict(domain=[0, 0.45], title="L0 (latents, or coefficients, per token)"),
                         yaxis=dict(title="explained variance"),
                         xaxis2=dict(domain=[0.55, 1], title="L0", anchor="y2"),
                         yaxis2=dict(title="CE recovered (mean ablation)", anchor="x2"),
                         legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, font=dict(size=11)))
    return go.Figure(data=traces, layout=layout)

"""The tuned lens beside the logit lens: both grids for one text, and per-layer KL / cross-entropy curves."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .lens import logit_lens_grid
from .residual import _with_alpha
from .style import PALETTE, base_layout, require

COMPARISON_COLUMNS = ["lens", "seq", "layer", "kl_to_final", "cross_entropy"]
LENS_COLORS = {"logit": PALETTE[0], "tuned": PALETTE[1], "unigram": "#7f7f7f"}
LENS_NAMES = {"logit": "logit lens", "tuned": "tuned lens", "unigram": "unigram (a constant)"}


def lens_side_by_side(logit: pd.DataFrame, tuned: pd.DataFrame, title: str = "Logit lens vs tuned lens",
                      seq=None) -> go.Figure:
    """The logit-lens grid above the tuned-lens grid for the same text (same rows, columns and colours).

    Args:
        logit / tuned: `interp.logit_lens` and `interp.tuned_lens` frames of the same text (same layers
            and positions).
        seq: which sequence to draw (default: the first).

    Returns:
        Two heatmaps [n_layers + 1, pos], stacked so each keeps its full width; frames mark cells whose
        top-1 token is the actual next token; hovering shows the top-k.
    """
    figs = [logit_lens_grid(df, title=name, seq=seq) for df, name in ((logit, "logit lens"), (tuned, "tuned lens"))]
    a, b = figs
    if list(a.data[0].y) != list(b.data[0].y) or list(a.data[0].x) != list(b.data[0].x):
        raise ValueError("lens_side_by_side: the two frames cover different layers or positions")
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.16, shared_xaxes=False,
                        subplot_titles=("logit lens (final norm + unembedding)", "tuned lens (translator, then the same)"))
    shapes = []
    for row, f in ((1, a), (2, b)):
        trace = f.data[0]
        trace.showscale = row == 1
        fig.add_trace(trace, row=row, col=1)
        ref = "" if row == 1 else "2"
        shapes += [{**s.to_plotly_json(), "xref": f"x{ref}", "yref": f"y{ref}"} for s in f.layout.shapes]
        xaxis = f.layout.xaxis.to_plotly_json()
        if row == 1:
            xaxis.pop("title", None)  # it would sit on the lower panel's title
        fig.update_xaxes(xaxis, row=row, col=1)
        fig.update_yaxes(f.layout.yaxis.to_plotly_json(), row=row, col=1)
    fig.layout.shapes = shapes
    fig.update_layout(**base_layout(
        f"{title}: the top-1 prediction after each block, read two ways",
        "colour = probability of the top-1 token; framed = it is the actual next token; hover for the top k",
        width=a.layout.width, height=int(2 * a.layout.height - 150), margin=a.layout.margin,
    ))
    return fig


def _band(fig, g: pd.DataFrame, col: str, lens: str, color: str, row: int, show: bool) -> None:
    name = LENS_NAMES.get(lens, f"{lens} lens")
    by = g.groupby("layer")[col]
    x = by.mean().index.tolist()
    lo, hi = by.quantile(0.1).tolist(), by.quantile(0.9).tolist()
    fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", mode="lines", line=dict(width=0),
                             fillcolor=_with_alpha(color, 0.18), hoverinfo="skip", legendgroup=lens,
                             name=f"{name}: 10-90% of texts", showlegend=show), row=row, col=1)
    fig.add_trace(go.Scatter(x=x, y=by.mean().tolist(), mode="lines+markers", name=f"{name}: mean",
                             line=dict(color=color, width=2.5, dash="dot" if lens == "unigram" else None),
                             legendgroup=lens, showlegend=show,
                             hovertemplate=f"{name}<br>layer %{{x}}<br>{col} %{{y:.3f}} nats<extra></extra>"),
                  row=row, col=1)


def lens_comparison_curves(df: pd.DataFrame, title: str = "Logit lens vs tuned lens") -> go.Figure:
    """Per-layer KL to the final output and next-token cross-entropy, logit vs tuned lens (and the
    constant unigram, when the frame has it), with a band.

    Args:
        df: `interp.lens_comparison(..., by_seq=True)` (columns `lens`, `seq`, `layer`, `kl_to_final`,
            `cross_entropy`): one row per held-out text (seq), lens and layer.

    Returns:
        Two panels against depth (0 = embedding, last = the output): the mean over texts as a line and
        the 10th-90th percentile over texts as a band, one colour per lens.
    """
    require(df, COMPARISON_COLUMNS, "lens_comparison_curves")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("KL(output || lens), nats", "cross-entropy on the next token, nats"))
    for i, (name, g) in enumerate(df.groupby("lens", sort=True)):
        color = LENS_COLORS.get(name, PALETTE[(i + 2) % len(PALETTE)])
        _band(fig, g, "kl_to_final", name, color, 1, True)
        _band(fig, g, "cross_entropy", name, color, 2, False)
    layers = sorted(df["layer"].unique())
    n_texts = df["seq"].nunique()
    fig.update_layout(**base_layout(
        f"{title}: how far each layer's reading is from the output",
        f"line = mean over {n_texts} held-out texts, band = 10th-90th percentile over texts; last layer = the output",
        width=820, height=720, legend=dict(groupclick="togglegroup"),
    ))
    fig.update_xaxes(title=dict(text="layer (0 = embedding, l = after block l)"), tickmode="array", tickvals=layers,
                     row=2, col=1)
    fig.update_xaxes(tickmode="array", tickvals=layers, row=1, col=1)
    return fig

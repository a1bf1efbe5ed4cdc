"""Where the parameters are: stacked bars per preset, as counts and as shares."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import PALETTE, base_layout, require

PART_NAMES = {"embedding": "embedding (= output layer)", "attention": "attention W_Q W_K W_V W_O",
              "qk_norm": "QK-norm gains", "ffn": "SwiGLU feed-forward", "norms": "block norms",
              "final_norm": "final norm"}


def param_breakdown(df: pd.DataFrame, title: str = "Parameters per preset") -> go.Figure:
    """Stacked bars, one per preset and one segment per part: counts on top, shares below.

    Args:
        df: `interp.param_table` rows for several configs (columns `config`, `part`, `count`; the
            "total" rows are left out, the bars add up to them).

    Returns:
        Two stacked bar charts, one above the other (parameter count; share of the total), with the
        total and the embedding's share written above each bar of the first. The panels share the
        figure's width, which grows with the number of presets up to 1,200 px (a 1400-px page).
    """
    require(df, ["config", "part", "count"], "param_breakdown")
    df = df[df["part"] != "total"]
    presets = list(dict.fromkeys(df["config"]))
    parts = list(dict.fromkeys(df["part"]))
    totals = df.groupby("config", sort=False)["count"].sum().reindex(presets)
    fig = make_subplots(rows=2, cols=1, subplot_titles=["parameters", "share of the parameters"],
                        vertical_spacing=0.16)
    for i, part in enumerate(parts):
        counts = df[df["part"] == part].groupby("config", sort=False)["count"].sum().reindex(presets, fill_value=0)
        share = counts / totals
        name = PART_NAMES.get(part, str(part))
        style = dict(name=name, legendgroup=name, marker_color=PALETTE[i % len(PALETTE)], customdata=share.values)
        fig.add_trace(go.Bar(x=presets, y=counts.values, **style,
                             hovertemplate=f"{name}<br>%{{x}}: %{{y:,}} parameters (%{{customdata:.1%}})<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=presets, y=share.values, showlegend=False, **style,
                             hovertemplate=f"{name}<br>%{{x}}: %{{y:.1%}} of the parameters<extra></extra>"),
                      row=2, col=1)
    for p in presets:
        emb = df[(df["config"] == p) & (df["part"] == "embedding")]["count"].sum()
        note = f"{totals[p]:,}" + (f"<br>embedding {emb / totals[p]:.0%}" if emb else "")
        fig.add_annotation(x=p, y=totals[p], text=note, showarrow=False, yshift=22, font=dict(size=10),
                           xref="x", yref="y")
    fig.update_layout(**base_layout(
        title, "stacked by part; the number above a bar is the total (the tied embedding counted once)",
        barmode="stack", width=int(min(1200, max(760, 110 * len(presets) + 420))), height=860,
    ))
    fig.update_xaxes(title=dict(text="preset"), type="category")
    fig.update_yaxes(title=dict(text="parameters (count)"), range=[0, float(totals.max()) * 1.2], row=1, col=1)
    fig.update_yaxes(title=dict(text="share of all parameters"), tickformat=".0%", range=[0, 1], row=2, col=1)
    return fig

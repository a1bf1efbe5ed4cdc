"""Where the parameters are: a stacked bar per preset."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .style import PALETTE, base_layout, require


PART_NAMES = {"embedding": "embedding (= output layer)", "attention": "attention W_Q W_K W_V W_O",
              "qk_norm": "QK-norm gains", "ffn": "SwiGLU feed-forward", "norms": "block norms",
              "final_norm": "final norm"}


def param_breakdown(df: pd.DataFrame, title: str = "Parameters per preset") -> go.Figure:
    """Stacked bars: one bar per preset, one segment per component (embedding, attention, ...).

    Args:
        df: `interp.param_table` rows for several configs (columns `config`, `part`, `count`; the
            "total" rows are left out, the bars add up to them); the embedding's share is written
            above each bar.

    Returns:
        A stacked bar chart of parameter counts, the total and the embedding share above each bar.
    """
    require(df, ["config", "part", "count"], "param_breakdown")
    df = df[df["part"] != "total"].rename(columns={"config": "preset", "part": "component", "count": "params"})
    presets = list(dict.fromkeys(df["preset"]))
    components = list(dict.fromkeys(df["component"]))
    totals = df.groupby("preset", sort=False)["params"].sum()
    fig = go.Figure()
    for i, comp in enumerate(components):
        d = df[df["component"] == comp].groupby("preset", sort=False)["params"].sum().reindex(presets, fill_value=0)
        share = d / totals.reindex(presets)
        fig.add_trace(go.Bar(
            x=presets, y=d.values, name=PART_NAMES.get(comp, str(comp)), marker_color=PALETTE[i % len(PALETTE)],
            customdata=share.values, hovertemplate=f"{comp}<br>%{{x}}: %{{y:,}} parameters (%{{customdata:.1%}})<extra></extra>",
        ))
    for p in presets:
        emb = df[(df["preset"] == p) & (df["component"].astype(str).str.lower().str.startswith("embed"))]["params"].sum()
        note = f"{totals[p]:,}" + (f"<br>embedding {emb / totals[p]:.0%}" if emb else "")
        fig.add_annotation(x=p, y=totals[p], text=note, showarrow=False, yshift=22, font=dict(size=11))
    fig.update_layout(**base_layout(
        title, "stacked by component; the number above a bar is the total (the tied embedding counted once)",
        barmode="stack", width=int(max(560, 150 * len(presets) + 260)), height=520,
    ))
    fig.update_xaxes(title=dict(text="preset"), type="category")
    fig.update_yaxes(title=dict(text="parameters (count)"), range=[0, float(totals.max()) * 1.18])
    return fig

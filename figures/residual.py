"""Residual-stream RMS against depth, several models on one log-scale plot."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .style import PALETTE, base_layout, require

RMS_COLUMNS = ["kind", "layer", "mean", "q05", "q95"]


def _with_alpha(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def residual_rms(df: pd.DataFrame, title: str = "Residual-stream growth") -> go.Figure:
    """RMS of the residual stream per token against depth: the mean with a 5-95% quantile band.

    Args:
        df: `interp.residual_rms` output (columns `kind`, `layer` = depth in blocks, `mean`, `q05`, `q95`;
            `q50` drawn if present), with a `model` column when several models are shown. Only rows of
            kind "stream" are drawn (what a block writes, e.g. attention outputs, is left out); a depth
            shared by two rows is drawn once.

    Returns:
        One line per model on a log y axis, x = depth in blocks (x.5 = after that block's attention).
    """
    require(df, RMS_COLUMNS, "residual_rms")
    df = df.copy()
    if "model" not in df.columns:
        df["model"] = "model"
    df = df[df["kind"] == "stream"].assign(depth=lambda d: d["layer"].astype(float))
    df = df.drop_duplicates(subset=["model", "depth"]).sort_values(["model", "depth"])
    if df.empty:
        raise ValueError("residual_rms: no rows of kind 'stream' (the residual stream itself) to draw")

    fig = go.Figure()
    for i, (name, g) in enumerate(df.groupby("model", sort=False)):
        color = PALETTE[i % len(PALETTE)]
        x = g["depth"].tolist()
        fig.add_trace(go.Scatter(  # the band: q95 forwards, q05 backwards, filled
            x=x + x[::-1], y=g["q95"].tolist() + g["q05"].tolist()[::-1], fill="toself", mode="lines",
            fillcolor=_with_alpha(color, 0.18), line=dict(width=0), hoverinfo="skip",
            name=f"{name}: 5-95% of tokens", legendgroup=str(name), showlegend=True,
        ))
        fig.add_trace(go.Scatter(
            x=x, y=g["mean"], mode="lines+markers", name=f"{name}: mean", legendgroup=str(name),
            line=dict(color=color, width=2.5), customdata=g[["site"]].to_numpy(),
            hovertemplate=f"{name}<br>%{{customdata[0]}}<br>depth %{{x}}<br>mean RMS %{{y:.3g}}<extra></extra>",
        ))
        if "q50" in g.columns:
            fig.add_trace(go.Scatter(
                x=x, y=g["q50"], mode="lines", name=f"{name}: median", legendgroup=str(name),
                line=dict(color=color, width=1, dash="dot"), hovertemplate="median %{y:.3g}<extra></extra>",
            ))
    max_depth = int(df["depth"].max())
    fig.update_layout(**base_layout(
        f"{title}: how big the numbers in the stream get, block after block",
        "RMS = sqrt(mean of x² over d_model), per token; line = mean over held-out tokens, band = 5th-95th percentile",
        width=820, height=520, legend=dict(groupclick="togglegroup"),
    ))
    fig.update_xaxes(
        title=dict(text="depth (blocks; x.5 = after the attention of block x+1)"),
        tickmode="array", tickvals=list(range(max_depth + 1)),
        ticktext=["embedding"] + [f"block {l}" for l in range(1, max_depth + 1)],
    )
    fig.update_yaxes(type="log", title=dict(text="RMS of the residual stream (log scale)"))
    return fig

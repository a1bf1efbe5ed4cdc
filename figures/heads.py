"""Heads: detector scores as layer x head heatmaps, and what ablating heads does to the loss."""
from __future__ import annotations

from typing import Mapping, Union

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import PALETTE, SCALE, base_layout, head_label, require

KIND_TITLES = {
    "previous_token": "previous-token",
    "duplicate_token": "duplicate-token",
    "induction": "induction",
    "prefix_matching": "prefix-matching",
}


def head_scores(scores: Union[pd.DataFrame, Mapping[str, pd.DataFrame]], title: str = "Head scores") -> go.Figure:
    """One heatmap (layer x head) per detector, sharing one colour scale from 0 to 1.

    Args:
        scores: `interp.head_scores` output (columns `layer`, `head`, `score`), either one DataFrame
            (with a `kind` column for several detectors) or a dict kind -> DataFrame.

    Returns:
        A row of heatmaps, layer 0 at the top, the score written in each cell and in the hover.
    """
    if isinstance(scores, Mapping):
        parts = []
        for kind, d in scores.items():
            require(d, ["layer", "head", "score"], f"head_scores[{kind!r}]")
            parts.append(d.assign(kind=kind))
        scores = pd.concat(parts, ignore_index=True)
    require(scores, ["layer", "head", "score"], "head_scores")
    if "kind" not in scores.columns:
        scores = scores.assign(kind="score")
    kinds = list(dict.fromkeys(scores["kind"]))
    n_layers, n_heads = int(scores["layer"].max()) + 1, int(scores["head"].max()) + 1
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[KIND_TITLES.get(k, k) for k in kinds],
                        horizontal_spacing=0.12 / max(len(kinds) - 1, 1) + 0.04)
    for i, kind in enumerate(kinds, 1):
        d = scores[scores["kind"] == kind]
        z = np.full((n_layers, n_heads), np.nan)
        z[d["layer"].astype(int), d["head"].astype(int)] = d["score"].astype(float)
        fig.add_trace(go.Heatmap(
            z=z, x=list(range(n_heads)), y=list(range(n_layers)), zmin=0, zmax=1, colorscale=SCALE,
            text=np.vectorize(lambda v: "" if np.isnan(v) else f"{v:.2f}")(z), texttemplate="%{text}",
            xgap=2, ygap=2, showscale=i == 1, name=KIND_TITLES.get(kind, kind),
            colorbar=dict(title=dict(text="score"), len=0.9),
            hovertemplate=f"{KIND_TITLES.get(kind, kind)}<br>layer %{{y}}, head %{{x}}<br>score %{{z:.3f}}<extra></extra>",
        ), row=1, col=i)
        fig.update_xaxes(title=dict(text="head"), tickmode="array", tickvals=list(range(n_heads)), row=1, col=i)
        fig.update_yaxes(title=dict(text="layer (block index)") if i == 1 else None, tickmode="array",
                         tickvals=list(range(n_layers)), autorange="reversed", row=1, col=i)
    cell = 44 if n_heads * n_layers <= 100 else 26
    fig.update_layout(**base_layout(
        f"{title}: which heads behave as which kind of head",
        "score = average attention on the token the pattern predicts (0 = never, 1 = always); hover for values",
        width=int(max(520, len(kinds) * (n_heads * cell + 90) + 120)), height=int(max(360, n_layers * cell + 220)),
    ))
    return fig


def ablation_bars(df: pd.DataFrame, title: str = "Head ablation") -> go.Figure:
    """How much the loss rises when a head (or a set of heads) is removed.

    Args:
        df: `interp.ablate_heads` output, columns `layer`, `head`, `loss_clean`, `loss_ablated`, `delta`
            and, when present, `label` ("L1H2", "L1H2+L2H0" for heads ablated together) and `method`
            ("zero"/"mean": one bar colour each when both are there).

    Returns:
        Bars of `delta` in nats per token, one per row, largest first, hover with both losses.
    """
    require(df, ["layer", "head", "loss_clean", "loss_ablated", "delta"], "ablation_bars")
    df = df.copy()
    if "label" not in df.columns:
        df["label"] = [head_label(l, h) for l, h in zip(df["layer"], df["head"])]
    group = next((c for c in ("method", "ablation") if c in df.columns and df[c].nunique() > 1), None)
    suffix = f" ({df['method'].iloc[0]} ablation)" if "method" in df.columns and group is None else ""
    order = df.groupby("label", sort=False)["delta"].max().sort_values(ascending=False).index.tolist()
    fig = go.Figure()
    for i, (name, g) in enumerate(df.groupby(group, sort=False) if group else [("ablated", df)]):
        g = g.set_index("label").loc[[o for o in order if o in set(g["label"])]].reset_index()
        fig.add_trace(go.Bar(
            x=g["label"], y=g["delta"], name=f"{name} ablation" if group else "loss change",
            marker_color=PALETTE[i % len(PALETTE)], customdata=g[["loss_clean", "loss_ablated"]].to_numpy(),
            hovertemplate="%{x}<br>clean %{customdata[0]:.3f} → ablated %{customdata[1]:.3f}"
                          "<br>change %{y:+.3f} nats/token<extra></extra>",
        ))
    fig.add_hline(y=0, line=dict(color="black", width=1))
    fig.update_layout(**base_layout(
        f"{title}: the change in loss when heads are removed{suffix}",
        "loss on the repeated half of the sequences; bigger = the model relied on this head more",
        width=int(max(560, 60 * len(order) + 200)), height=460, barmode="group", showlegend=group is not None,
    ))
    fig.update_xaxes(title=dict(text="ablated head(s) (L = layer, H = head)"), type="category", categoryorder="array",
                     categoryarray=order)
    fig.update_yaxes(title=dict(text="Δ loss (nats per token)"))
    return fig

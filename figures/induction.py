"""Induction: the chapter's repeated-name table as a figure, and induction heads forming in training."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import FONT_SIZE, PALETTE, SCALE, base_layout, escape_token, head_label, label_width, require, short_label


def induction_table(df: pd.DataFrame, first: str = "p_first", second: str = "p_second",
                    title: str = "Copying a name it has seen once") -> go.Figure:
    """For each model, the probability of each token of a name at its first and its second occurrence.

    Args:
        df: `interp.induction_table` output: one row per token and model, columns `model`, `token`,
            and the probability the model gave that token at its first occurrence (`first`) and at
            its second occurrence (`second`). Rows keep the text's order within each model.

    Returns:
        A table-like heatmap: two rows per model (1st, 2nd occurrence), one column per token, each
        cell the probability as a percentage on the common 0-1 colour scale.
    """
    require(df, ["model", "token", first, second], "induction_table")
    models = list(dict.fromkeys(df["model"]))
    tokens = df[df["model"] == models[0]]["token"].tolist()
    for m in models[1:]:
        if df[df["model"] == m]["token"].tolist() != tokens:
            raise ValueError(f"induction_table: model {m!r} has other tokens than {models[0]!r}; "
                             "all models must read the same text")
    rows, z = [], []
    for m in models:
        d = df[df["model"] == m]
        rows += [f"{m} · 1st time", f"{m} · 2nd time"]
        z += [d[first].astype(float).tolist(), d[second].astype(float).tolist()]
    z = np.array(z)
    text = np.vectorize(lambda v: "" if np.isnan(v) else (f"{100 * v:.0f}%" if v >= 0.01 else "<1%"))(z)
    shown = [escape_token(t) for t in tokens]
    hover = np.array([[f"{r}<br>token {shown[c]}" for c in range(len(tokens))] for r in rows], dtype=object)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(len(tokens))), y=list(range(len(rows))), zmin=0, zmax=1, colorscale=SCALE,
        text=text, texttemplate="%{text}", customdata=hover, xgap=2, ygap=2,
        hovertemplate="%{customdata}<br>p = %{z:.2%}<extra></extra>",
        colorbar=dict(title=dict(text="probability of<br>this token"), tickformat=".0%"),
    ))
    for i in range(1, len(models)):  # a gap line between models
        fig.add_hline(y=2 * i - 0.5, line=dict(color="white", width=6))
    labels = [short_label(t) for t in tokens]
    cell_w = max(label_width(labels) + 16, 52)
    fig.update_layout(**base_layout(
        title, "the probability each model gives each token of the name when it appears the 1st and the 2nd time",
        width=int(len(tokens) * cell_w + label_width(rows) + 200), height=int(len(rows) * 36 + 230),
        margin=dict(l=int(label_width(rows) + 30)),
    ))
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(tokens))), ticktext=labels,
                     tickfont=dict(size=FONT_SIZE + 1), title=dict(text="token of the name"), showgrid=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))), ticktext=rows, autorange="reversed",
                     showgrid=False)
    return fig


def induction_over_training(df: pd.DataFrame, top: int = 3,
                            title: str = "Induction heads forming during training") -> go.Figure:
    """Each head's induction score against the number of training tokens seen (the phase change).

    Args:
        df: one row per snapshot and head: columns `tokens` (training tokens seen), `layer`, `head`,
            `score`; an optional `model` column prefixes the legend; an optional `val_loss` column
            (one value per snapshot) is drawn on a second axis.
        top: how many heads (by final score) to draw in colour; the rest are grey.
    """
    require(df, ["tokens", "layer", "head", "score"], "induction_over_training")
    df = df.sort_values("tokens")
    keys = ["model", "layer", "head"] if "model" in df.columns else ["layer", "head"]
    final = df.groupby(keys)["score"].last().sort_values(ascending=False)
    highlight = set(final.index[:top])
    fig = go.Figure()
    for rank, key in enumerate(final.index):
        g = df[(df[keys] == pd.Series(key if isinstance(key, tuple) else (key,), index=keys)).all(axis=1)]
        name = head_label(*key[-2:]) if len(keys) == 2 else f"{key[0]} {head_label(*key[1:])}"
        on = key in highlight
        fig.add_trace(go.Scatter(
            x=g["tokens"], y=g["score"], mode="lines+markers" if on else "lines", name=name,
            line=dict(color=PALETTE[rank % len(PALETTE)] if on else "rgba(150,150,150,0.45)", width=2.5 if on else 1),
            showlegend=on, hovertemplate=f"{name}<br>%{{x:.3s}} tokens<br>induction score %{{y:.3f}}<extra></extra>",
        ))
    if "val_loss" in df.columns:
        loss = df.drop_duplicates("tokens")[["tokens", "val_loss"]].dropna()
        fig.add_trace(go.Scatter(x=loss["tokens"], y=loss["val_loss"], name="held-out loss", yaxis="y2",
                                 mode="lines", line=dict(color="black", dash="dash"),
                                 hovertemplate="%{x:.3s} tokens<br>loss %{y:.3f}<extra></extra>"))
        fig.update_layout(yaxis2=dict(title=dict(text="held-out loss (nats per token)"), overlaying="y",
                                      side="right", showgrid=False))
    t = df["tokens"][df["tokens"] > 0]
    log_x = len(t) > 0 and t.max() / t.min() > 100
    fig.update_layout(**base_layout(
        title, "induction score of every head at each saved snapshot; coloured = the heads that end highest",
        width=860, height=480,
    ))
    fig.update_xaxes(title=dict(text="training tokens seen" + (" (log scale)" if log_x else "")),
                     type="log" if log_x else "linear")
    fig.update_yaxes(title=dict(text="induction score (attention to the token after the match)"), range=[0, 1])
    return fig

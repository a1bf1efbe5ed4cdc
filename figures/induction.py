"""Induction: the chapter's repeated-name table as a figure, and induction heads forming in training."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import FONT_SIZE, PALETTE, SCALE, base_layout, escape_token, head_label, label_width, require, short_label


def _occurrence_name(o) -> str:
    return {1: "1st time", 2: "2nd time", 3: "3rd time", "first": "1st time", "later": "later"}.get(o, f"{o}th time")


def induction_table(df: pd.DataFrame, prob: str = "prob",
                    title: str = "Copying a name it has seen once") -> go.Figure:
    """For each model, the probability of each token of a name at its first and later occurrences.

    Args:
        df: `interp.induction_table` output (columns `model`, `occurrence`, `token_index`, `token`,
            `prob`), or `interp.induction_stories` output with `prob="mean_prob"` (no `token` column:
            the columns are then "token 1", "token 2", ...).
        prob: the probability column to show.

    Returns:
        A table-like heatmap: one row per model and occurrence, one column per token of the name, each
        cell the probability as a percentage on the common 0-1 colour scale.
    """
    require(df, ["model", "occurrence", "token_index", prob], "induction_table")
    models = list(dict.fromkeys(df["model"]))
    occurrences = list(dict.fromkeys(df.sort_values("occurrence", kind="stable")["occurrence"]))
    cols = sorted(df["token_index"].unique())
    if "token" in df.columns:
        first = df[(df["model"] == models[0]) & (df["occurrence"] == occurrences[0])].set_index("token_index")["token"]
        tokens = [first.get(i, "") for i in cols]
        ref = dict(zip(first.index, first))
        for (m, o), g in df.groupby(["model", "occurrence"], sort=False):
            if any(ref.get(i, t) != t for i, t in zip(g["token_index"], g["token"])):
                raise ValueError(f"induction_table: model {m!r} (occurrence {o}) has other tokens than {models[0]!r}; "
                                 "all rows must be the same name read by the same tokenizer")
    else:
        tokens = [f"token {i + 1}" for i in cols]
    rows = [(m, o) for m in models for o in occurrences]
    cell = df.set_index(["model", "occurrence", "token_index"])[prob]
    z = np.array([[float(cell.get((m, o, i), np.nan)) for i in cols] for m, o in rows])
    text = np.vectorize(lambda v: "" if np.isnan(v) else (f"{100 * v:.0f}%" if v >= 0.01 else "<1%"))(z)
    names = [f"{m} · {_occurrence_name(o)}" for m, o in rows]
    shown = [escape_token(t) for t in tokens]
    hover = np.array([[f"{r}<br>token {shown[c]}" for c in range(len(cols))] for r in names], dtype=object)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(len(cols))), y=list(range(len(rows))), zmin=0, zmax=1, colorscale=SCALE,
        text=text, texttemplate="%{text}", customdata=hover, xgap=2, ygap=2,
        hovertemplate="%{customdata}<br>p = %{z:.2%}<extra></extra>",
        colorbar=dict(title=dict(text="probability of<br>this token"), tickformat=".0%"),
    ))
    for i in range(1, len(models)):  # a white gap between models
        fig.add_hline(y=len(occurrences) * i - 0.5, line=dict(color="white", width=6))
    labels = [short_label(t) for t in tokens] if "token" in df.columns else tokens
    cell_w = max(label_width(labels) + 16, 52)
    fig.update_layout(**base_layout(
        title, "the probability each model gives each token of the name, given the text before it",
        width=int(len(cols) * cell_w + label_width(names) + 200), height=int(len(rows) * 36 + 230),
        margin=dict(l=int(label_width(names) + 30)),
    ))
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(cols))), ticktext=labels,
                     tickfont=dict(size=FONT_SIZE + 1), title=dict(text="token of the name"), showgrid=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))), ticktext=names, autorange="reversed",
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

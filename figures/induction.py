"""Induction: the chapter's repeated-name table as a figure, and induction heads forming in training."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import FONT_SIZE, PALETTE, SCALE, base_layout, escape_token, head_label, label_width, require, round_axis, short_label


def _occurrence_name(o) -> str:
    return {1: "1st time", 2: "2nd time", 3: "3rd time", "first": "1st time", "later": "later"}.get(o, f"{o}th time")


def induction_table(df: pd.DataFrame, prob: str = "prob",
                    title: str = "Copying a name it has seen once") -> go.Figure:
    """For each model, the probability of each token of a name at its first and later occurrences.

    Args:
        df: `interp.induction_table` output (columns `model`, `occurrence`, `token_index`, `token`,
            `prob`), or `interp.induction_stories` output with `prob="mean_prob"` (no `token` column).
            When all rows split the name into the same tokens, they label the columns; otherwise
            (no `token` column, or models with different tokenizers) the columns are "piece 1",
            "piece 2", ... and each cell names its token.
        prob: the probability column to show.

    Returns:
        A table-like heatmap: one row per model and occurrence, one column per token of the name, each
        cell the probability as a percentage on the common 0-1 colour scale.
    """
    require(df, ["model", "occurrence", "token_index", prob], "induction_table")
    if "name" in df.columns and df["name"].nunique() > 1:
        raise ValueError(f"induction_table: one name per figure, got {df['name'].nunique()} "
                         f"({list(df['name'].unique())[:4]}); select one with df[df.name == ...]")
    models = list(dict.fromkeys(df["model"]))
    occurrences = list(dict.fromkeys(df.sort_values("occurrence", kind="stable")["occurrence"]))
    cols = sorted(df["token_index"].unique())
    rows = [(m, o) for m in models for o in occurrences]
    cell = df.set_index(["model", "occurrence", "token_index"])
    z = np.array([[float(cell[prob].get((m, o, i), np.nan)) for i in cols] for m, o in rows])
    pct = np.vectorize(lambda v: "" if np.isnan(v) else (f"{100 * v:.0f}%" if v >= 0.01 else "<1%"))(z)
    # One tokenizer for all rows: the tokens label the columns. Several (a character model beside a
    # BPE one): columns are the name's pieces in order, and each cell names its own token.
    per_row = [[cell["token"].get((m, o, i)) if "token" in df.columns else None for i in cols] for m, o in rows]
    same = "token" in df.columns and all(r == per_row[0] for r in per_row)
    if same:
        tokens, labels, text = per_row[0], [short_label(t) for t in per_row[0]], pct
    else:
        tokens = [f"piece {i + 1}" for i in cols]
        labels = tokens
        text = pct if "token" not in df.columns else np.array(
            [[f"{short_label(t)}<br>{v}" if t is not None else "" for t, v in zip(tr, pr)] for tr, pr in zip(per_row, pct)],
            dtype=object)
    names = [f"{m} · {_occurrence_name(o)}" for m, o in rows]
    hover = np.array([[f"{r}<br>token {escape_token(per_row[j][c] if per_row[j][c] is not None else tokens[c])}"
                       for c in range(len(cols))] for j, r in enumerate(names)], dtype=object)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(len(cols))), y=list(range(len(rows))), zmin=0, zmax=1, colorscale=SCALE,
        text=text, texttemplate="%{text}", customdata=hover, xgap=2, ygap=2,
        hovertemplate="%{customdata}<br>p = %{z:.2%}<extra></extra>",
        colorbar=dict(title=dict(text="probability of<br>this token"), tickformat=".0%"),
    ))
    for i in range(1, len(models)):  # a white gap between models
        fig.add_hline(y=len(occurrences) * i - 0.5, line=dict(color="white", width=6))
    cell_w = max(label_width(labels) + 16, 52)
    fig.update_layout(**base_layout(
        title, "the probability each model gives each token of the name, given the text before it",
        width=int(len(cols) * cell_w + label_width(names) + 200), height=int(len(rows) * (36 if same else 46) + 230),
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
    loss = df.drop_duplicates("tokens")[["tokens", "val_loss"]].dropna() if "val_loss" in df.columns else []
    if len(loss):
        fig.add_trace(go.Scatter(x=loss["tokens"], y=loss["val_loss"], name="held-out loss", yaxis="y2",
                                 mode="lines", line=dict(color="black", dash="dash"),
                                 hovertemplate="%{x:.3s} tokens<br>loss %{y:.3f}<extra></extra>"))
    t = df["tokens"][df["tokens"] > 0]
    log_x = len(t) > 0 and t.max() / t.min() > 100
    fig.update_layout(**base_layout(
        title, "induction score of every head at each saved snapshot; coloured = the heads that end highest",
        width=900, height=480, legend=dict(x=1.1, xanchor="left"),
    ))
    fig.update_layout(yaxis=dict(title=dict(text="induction score (attention to the token after the match)"),
                                 range=[0, 1]))
    if len(loss):
        fig.update_layout(yaxis2=dict(title=dict(text="held-out loss (nats per token)"), overlaying="y",
                                      side="right", showgrid=False, **round_axis(loss["val_loss"])))
    fig.update_xaxes(title=dict(text="training tokens seen" + (" (log scale)" if log_x else "")),
                     type="log" if log_x else "linear")
    return fig

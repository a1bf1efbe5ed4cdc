"""Attention patterns as heatmaps, the string tokens on both axes: one head, or a layer's heads."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import FONT_SIZE, LINE_H, MAX_WIDTH, SCALE, base_layout, escape_token, head_label, label_width, require, short_label

ATTN_COLUMNS = ["layer", "head", "query_pos", "key_pos", "query_token", "key_token", "weight"]


def _tokens(df: pd.DataFrame) -> list[str]:
    """The token at each position 0..T-1 (from the query column, with the key column as a fallback)."""
    by_pos = dict(zip(df["key_pos"], df["key_token"]))
    by_pos.update(zip(df["query_pos"], df["query_token"]))
    n = int(max(df["query_pos"].max(), df["key_pos"].max())) + 1
    return [by_pos.get(p, "") for p in range(n)]


def _pattern(df: pd.DataFrame, n: int) -> np.ndarray:
    """[query_pos, key_pos] weights; NaN where no weight is given (the future, under a causal mask)."""
    z = np.full((n, n), np.nan)
    z[df["query_pos"].astype(int), df["key_pos"].astype(int)] = df["weight"].astype(float)
    return z


def _heatmap(z: np.ndarray, tokens: list[str], name: str, showscale: bool) -> go.Heatmap:
    shown = [escape_token(t) for t in tokens]
    hover = np.array([[f"{name}<br>query {q} {shown[q]}<br>key {k} {shown[k]}" for k in range(len(tokens))]
                      for q in range(len(tokens))], dtype=object)
    return go.Heatmap(
        z=z, x=list(range(len(tokens))), y=list(range(len(tokens))), zmin=0, zmax=1, colorscale=SCALE,
        customdata=hover, hovertemplate="%{customdata}<br>weight %{z:.3f}<extra></extra>",
        showscale=showscale, colorbar=dict(title=dict(text="attention<br>weight"), len=0.8), name=name,
    )


def _check_one(df: pd.DataFrame, layer: Optional[int], head: Optional[int]) -> pd.DataFrame:
    if layer is not None:
        df = df[df["layer"] == layer]
    if head is not None:
        df = df[df["head"] == head]
    pairs = df[["layer", "head"]].drop_duplicates()
    if len(pairs) != 1:
        raise ValueError(f"attention_heatmap: expected the pattern of one head, found {len(pairs)} "
                         f"(layer, head) pairs; pass layer= and head=")
    return df


def attention_heatmap(df: pd.DataFrame, layer: Optional[int] = None, head: Optional[int] = None,
                      title: str = "Attention pattern") -> go.Figure:
    """The attention pattern of one head: queries down, keys across, both labelled with their tokens.

    Args:
        df: `interp.attention_patterns` output (long format; columns `layer`, `head`, `query_pos`,
            `key_pos`, `query_token`, `key_token`, `weight`).
        layer, head: which head to draw when `df` holds several.

    Returns:
        A [pos, pos] heatmap; the causal future (no weight given) is left blank.
    """
    require(df, ATTN_COLUMNS, "attention_heatmap")
    df = _check_one(df, layer, head)
    layer, head = int(df["layer"].iloc[0]), int(df["head"].iloc[0])
    tokens = _tokens(df)
    n = len(tokens)
    fig = go.Figure(_heatmap(_pattern(df, n), tokens, head_label(layer, head), True))
    labels = [short_label(t) for t in tokens]
    cell = 22 if n <= 24 else LINE_H + 1  # px per token: at least one line of tick text
    side = min(max(int(n * cell), 360), int(MAX_WIDTH - label_width(labels) - 180))
    fig.update_layout(**base_layout(
        f"{title}: layer {layer}, head {head}",
        "row = the token that looks (query), column = the token it looks at (key); each row sums to 1",
        width=int(side + label_width(labels) + 180), height=int(side + label_width(labels) + 160),
        margin=dict(l=int(label_width(labels) + 70), b=int(label_width(labels) + 70), t=100, r=40),
    ))
    fig.update_xaxes(tickmode="array", tickvals=list(range(n)), ticktext=labels, tickangle=-90,
                     tickfont=dict(size=FONT_SIZE), title=dict(text="key token (attended to)"), showgrid=False)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n)), ticktext=labels, autorange="reversed",
                     tickfont=dict(size=FONT_SIZE), title=dict(text="query token (attending)"), showgrid=False,
                     scaleanchor="x")
    return fig


def attention_grid(df: pd.DataFrame, layer: Optional[int] = None, cols: int = 3,
                   title: str = "Attention patterns") -> go.Figure:
    """Every head of one layer side by side, one shared colour scale.

    Args:
        df: `interp.attention_patterns` output for one layer (or pass `layer`).
        cols: heads per row of the grid.
    """
    require(df, ATTN_COLUMNS, "attention_grid")
    if layer is not None:
        df = df[df["layer"] == layer]
    layers = sorted(df["layer"].unique())
    if len(layers) != 1:
        raise ValueError(f"attention_grid: expected one layer, found {len(layers)} ({layers[:8]}); pass layer=")
    layer = int(layers[0])
    heads = sorted(int(h) for h in df["head"].unique())
    tokens = _tokens(df)
    n = len(tokens)
    cols = min(cols, len(heads))
    rows = math.ceil(len(heads) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"head {h}" for h in heads],
                        horizontal_spacing=0.08, vertical_spacing=0.12 if rows > 1 else 0.1)
    labels = [short_label(t) for t in tokens]
    panel = max(260, min(n * 10, 480))
    panel = min(panel, int((MAX_WIDTH - 160) / cols - label_width(labels) - 30))  # the grid fits the page
    # Tick labels on a small panel overlap: label every k-th token, k such that each label has a line's height.
    step = max(1, math.ceil(n / 32), math.ceil(n * LINE_H / (0.85 * panel)))
    tickvals = list(range(0, n, step))
    for i, h in enumerate(heads):
        r, c = divmod(i, cols)
        z = _pattern(df[df["head"] == h], n)
        fig.add_trace(_heatmap(z, tokens, head_label(layer, h), i == 0), row=r + 1, col=c + 1)
        fig.update_xaxes(tickmode="array", tickvals=tickvals, ticktext=[labels[v] for v in tickvals],
                         tickangle=-90, tickfont=dict(size=FONT_SIZE - 2), showgrid=False, row=r + 1, col=c + 1)
        fig.update_yaxes(tickmode="array", tickvals=tickvals, ticktext=[labels[v] for v in tickvals],
                         autorange="reversed", tickfont=dict(size=FONT_SIZE - 2), showgrid=False,
                         row=r + 1, col=c + 1)
    fig.update_layout(**base_layout(
        f"{title}: all {len(heads)} heads of layer {layer}",
        "row = query token, column = key token" + (f"; one token in {step} labelled, hover for all" if step > 1 else ""),
        width=int(cols * (panel + label_width(labels) + 30) + 160),
        height=int(rows * (panel + label_width(labels) + 40) + 120),
    ))
    return fig

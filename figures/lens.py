"""The logit-lens grid: what the model would say if it stopped after each block."""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .style import CHAR_W, FONT_SIZE, LINE_H, MAX_WIDTH, SCALE, base_layout, escape_token, label_width, require, short_label

LENS_COLUMNS = ["layer", "pos", "token", "next_token", "top_tokens", "top_probs"]
CELL_CHARS = 6  # characters of the top-1 token shown inside a cell
FRAME_COLOR = "#ff2d55"


def layer_names(layers) -> list[str]:
    """Row labels: 0 is the embedding, l is the stream after block l (the last one is the output),
    l + 0.5 is the stream after block l + 1's attention (a logit lens read mid-block)."""
    last = max(layers)
    names = []
    for l in layers:
        if l == 0:
            names.append("embedding")
        elif float(l).is_integer():
            names.append(f"after block {int(l)}" + (" = output" if l == last else ""))
        else:
            names.append(f"block {int(l) + 1} mid (after attention)")
    return names


def cells_that_fit(tokens: pd.Series, cell_px: float) -> np.ndarray:
    """Each token as cell text, cut to what a cell `cell_px` wide holds: whole when it fits, else its
    first characters and "…", and "" only where not even one character and the ellipsis fit (hover
    still shows every token whole).

    >>> list(cells_that_fit(pd.Series(["a", " the", " wonderful"]), 40.0))
    ['a', '·the', '·wo…']
    """
    chars = int((cell_px - 6) // CHAR_W)  # characters that fit with a little padding
    labels = [short_label(t, CELL_CHARS) for t in tokens]
    return np.array([lab if len(html.unescape(lab)) <= chars else (short_label(t, chars) if chars >= 2 else "")
                     for t, lab in zip(tokens, labels)], dtype=object)


def _top1(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    tokens = df["top_tokens"].map(lambda t: list(t)[0] if len(t) else "")
    probs = df["top_probs"].map(lambda p: float(list(p)[0]) if len(p) else np.nan)
    return tokens, probs


def _hover(row) -> str:
    nxt = row["next_token"]
    head = f"pos {row['pos']}: {escape_token(row['token'])}"
    head += f" → next {escape_token(nxt)}" if isinstance(nxt, str) else " (last token)"
    lines = [head, row["layer_name"]]
    for i, (t, p) in enumerate(zip(row["top_tokens"], row["top_probs"]), 1):
        mark = " ✓" if isinstance(nxt, str) and t == nxt else ""
        lines.append(f"{i}. {escape_token(t):<12} {100 * float(p):5.1f}%{mark}")
    if "p_next" in row and isinstance(nxt, str) and not pd.isna(row["p_next"]):
        lines.append(f"p(next) = {100 * float(row['p_next']):.1f}%")
    return "<br>".join(lines)


def logit_lens_grid(df: pd.DataFrame, title: str = "Logit lens", seq=None) -> go.Figure:
    """The top-1 token at every layer (rows) and position (columns), coloured by its probability.

    Args:
        df: `interp.logit_lens` output, one row per (layer, pos), with columns `layer` (0 = after the
            embedding, l = after block l, l + 0.5 mid-block), `pos`, `token`, `next_token` (None/NaN at the last
            position), `top_tokens` and `top_probs` (lists, best first); `p_next` is used if present.
        title: the figure title (the model name is a good addition).
        seq: which sequence to draw when `df` has a `seq` column (default: the first).

    Returns:
        A heatmap [n_layers + 1, pos] with the embedding row at the top and the output at the bottom;
        a frame marks each cell whose top-1 token is the actual next token; hovering shows the top-k.
    """
    require(df, LENS_COLUMNS, "logit_lens_grid")
    if "seq" in df.columns:  # a lens over several sequences: draw one
        seq = df["seq"].iloc[0] if seq is None else seq
        df = df[df["seq"] == seq]
    df = df.sort_values(["layer", "pos"]).reset_index(drop=True)
    layers = sorted(df["layer"].unique())
    positions = sorted(df["pos"].unique())
    if layers[0] != 0 or positions != list(range(positions[0], positions[0] + len(positions))):
        raise ValueError(f"logit_lens_grid: expected layers from 0 (the embedding) and consecutive positions, "
                         f"got layers {layers[:10]}")
    n_rows, n_cols, p0 = len(layers), len(positions), positions[0]
    if len(df) != n_rows * n_cols:
        raise ValueError(f"logit_lens_grid: {len(df)} rows for {n_rows} layers x {n_cols} positions")
    names = layer_names(layers)
    df["layer_name"] = df["layer"].map(dict(zip(layers, names)))
    top_tok, top_p = _top1(df)

    shape = (n_rows, n_cols)
    z = top_p.to_numpy(float).reshape(shape)
    text = np.array([short_label(t, CELL_CHARS) for t in top_tok], dtype=object).reshape(shape)
    hover = np.array([_hover(r) for _, r in df.iterrows()], dtype=object).reshape(shape)
    hit = np.array([isinstance(n, str) and t == n for t, n in zip(top_tok, df["next_token"])]).reshape(shape)

    fig = go.Figure(go.Heatmap(
        z=z, x=positions, y=list(range(n_rows)), text=text, customdata=hover,
        texttemplate="%{text}", textfont=dict(size=FONT_SIZE - 1),
        hovertemplate="%{customdata}<extra></extra>",
        colorscale=SCALE, zmin=0, zmax=1, xgap=1, ygap=1,
        colorbar=dict(title=dict(text="top-1<br>probability"), tickformat=".0%", len=0.9),
    ))
    # all frames in one assignment: add_shape revalidates the whole layout on every call
    fig.layout.shapes = [
        dict(type="rect", x0=positions[c] - 0.5, x1=positions[c] + 0.5, y0=r - 0.5, y1=r + 0.5,
             line=dict(color=FRAME_COLOR, width=2.5), layer="above", name="next-token match")
        for r, c in zip(*np.nonzero(hit))
    ]

    # one column wide enough for its longest label, rows tall enough for a line of text
    row0 = df[df["layer"] == 0]
    inputs = [short_label(t) for t in row0["token"]]
    cell_w = max(label_width(list(text.ravel()) + inputs) + 10, 28)
    cell_h = max(LINE_H + 12, 26)
    left = label_width(names) + 20
    fit = (MAX_WIDTH - left - 140) / n_cols  # the whole grid fits the page: narrower cells, never a cut panel
    if cell_w > fit:
        cell_w = max(fit, 4.0)
        fig.data[0].text = cells_that_fit(top_tok, cell_w).reshape(shape)  # as much of each token as its cell holds
    fig.update_layout(**base_layout(
        f"{title}: the top-1 prediction read from the residual stream after each block",
        "colour = probability of the top-1 token; framed = it is the actual next token; hover for the top "
        f"{len(df['top_tokens'].iloc[0])}",
        width=int(left + n_cols * cell_w + 140), height=int(n_rows * cell_h + 260),
        margin=dict(l=int(left), r=40, t=110, b=110),
    ))
    fig.update_xaxes(
        tickmode="array", tickvals=positions, ticktext=inputs, tickangle=0 if cell_w >= label_width(inputs) + 4 else -90,
        tickfont=dict(size=FONT_SIZE), title=dict(text="input token (position →)"), showgrid=False, zeroline=False,
        range=[p0 - 0.5, p0 + n_cols - 0.5],
    )
    fig.update_yaxes(
        tickmode="array", tickvals=list(range(n_rows)), ticktext=names, autorange="reversed",
        title=dict(text="read after"), showgrid=False, zeroline=False,
    )
    return fig

"""Training curves from a train_log.csv: loss against tokens seen."""
from __future__ import annotations

from typing import Optional

import pandas as pd
import plotly.graph_objects as go

from .style import PALETTE, base_layout, require


def loss_curves(df: pd.DataFrame, title: str = "Training", stages: Optional[pd.DataFrame] = None) -> go.Figure:
    """Training and held-out loss against the number of training tokens seen.

    Args:
        df: rows of a train_log.csv (columns `tokens`, `train_loss`, `val_loss`; `step` and `lr` shown
            in the hover when present; `val_loss` may be empty on steps without an evaluation), with a
            `model` column when several runs are drawn; `rep_second` (loss on the second copy of
            repeated random tokens) is drawn dotted when present.
        title: the figure's title.
        stages: optional stretches of each run on the same axis of tokens seen, columns `model`, `stage` (a
            label), `start`, `end` (tokens): e.g. its pure induction curriculum (no text trained: the held-out
            loss on text rises there) or each stage of a run trained in stages. Drawn as bands in the
            model's colour, each labelled at its start.

    Returns:
        One colour per model: the training loss as a thin line, the held-out loss as markers and a line.
    """
    require(df, ["tokens", "train_loss", "val_loss"], "loss_curves")
    df = df.copy()
    if "model" not in df.columns:
        df["model"] = "model"
    fig = go.Figure()
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(df["model"].drop_duplicates())}
    for name, g in df.groupby("model", sort=False):
        color = colors[name]
        extra = [c for c in ("step", "lr") if c in g.columns]
        hover = "".join(f"<br>{c} %{{customdata[{j}]:.4g}}" for j, c in enumerate(extra))
        tr = g.dropna(subset=["train_loss"])
        fig.add_trace(go.Scatter(
            x=tr["tokens"], y=tr["train_loss"], mode="lines", name=f"{name}: train", legendgroup=str(name),
            line=dict(color=color, width=1), opacity=0.55, customdata=tr[extra].to_numpy() if extra else None,
            hovertemplate=f"{name} train<br>%{{x:.3s}} tokens<br>loss %{{y:.3f}}{hover}<extra></extra>",
        ))
        va = g.dropna(subset=["val_loss"])
        fig.add_trace(go.Scatter(
            x=va["tokens"], y=va["val_loss"], mode="lines+markers", name=f"{name}: held-out", legendgroup=str(name),
            line=dict(color=color, width=2.5), customdata=va[extra].to_numpy() if extra else None,
            hovertemplate=f"{name} held-out<br>%{{x:.3s}} tokens<br>loss %{{y:.3f}}{hover}<extra></extra>",
        ))
        if "rep_second" in g.columns and g["rep_second"].notna().any():
            rep = g.dropna(subset=["rep_second"])
            fig.add_trace(go.Scatter(
                x=rep["tokens"], y=rep["rep_second"], mode="lines", name=f"{name}: repeated half",
                legendgroup=str(name), line=dict(color=color, width=1.5, dash="dot"),
                hovertemplate=f"{name}: loss on the second copy of random tokens<br>%{{x:.3s}} tokens"
                              "<br>loss %{y:.3f}<extra></extra>",
            ))
    if stages is not None and len(stages):
        _draw_stages(fig, stages, colors)
    fig.update_layout(**base_layout(
        f"{title}: loss against training tokens",
        "thin = training loss on the current batch, thick with markers = loss on held-out text"
        + ("; dotted = loss on the repeat of random tokens (drops when induction heads form)"
           if "rep_second" in df.columns else "")
        + ("; shaded = the stages named at their start" if stages is not None and len(stages) else ""),
        width=860, height=500,
    ))
    fig.update_xaxes(title=dict(text="training tokens seen"))
    fig.update_yaxes(title=dict(text="loss (nats per token)"))
    return fig


def _draw_stages(fig: go.Figure, stages: pd.DataFrame, colors: dict) -> None:
    """A band per stage in its model's colour, a dotted line at its start and its label at the top."""
    require(stages, ["model", "stage", "start", "end"], "loss_curves' stages")
    for i, row in enumerate(stages.itertuples(index=False)):
        color = colors.get(row.model, "#7f7f7f")
        fig.add_vrect(x0=row.start, x1=row.end, fillcolor=color, opacity=0.08, line_width=0, layer="below")
        fig.add_vline(x=row.start, line=dict(color=color, width=1, dash="dot"))
        fig.add_annotation(x=row.start, y=1, xref="x", yref="paper", yshift=-14 * (i % 4), xanchor="left",
                           yanchor="top", showarrow=False, text=f"{row.model}: {row.stage}",
                           font=dict(size=10, color=color))

"""RoPE's key property as a picture: the query-key score depends only on the distance m - n."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .style import PALETTE, base_layout, require


def rope_distance(df: pd.DataFrame, title: str = "RoPE scores depend only on distance") -> go.Figure:
    """The score of one rotated query and key against the query's position, one line per distance.

    Args:
        df: `interp.rope_distance_check` output (columns `m`, `n`, `distance`, `score`), ideally with
            many positions m per distance: a flat line is the property.

    Returns:
        Lines of `score` against `m`, one per distance `m - n`.
    """
    require(df, ["m", "n", "distance", "score"], "rope_distance")
    fig = go.Figure()
    for i, (d, g) in enumerate(df.sort_values("m").groupby("distance", sort=True)):
        fig.add_trace(go.Scatter(
            x=g["m"], y=g["score"], mode="lines+markers", name=f"m - n = {d}",
            line=dict(color=PALETTE[i % len(PALETTE)]), marker=dict(size=5), customdata=g[["n"]].to_numpy(),
            hovertemplate=f"distance {d}<br>query at m=%{{x}}, key at n=%{{customdata[0]}}<br>score %{{y:.6f}}<extra></extra>",
        ))
    fig.update_layout(**base_layout(
        title, "the same query and key rotated to positions m and n: each line is flat, so only m - n matters",
        width=820, height=460,
    ))
    fig.update_xaxes(title=dict(text="query position m (tokens)"))
    fig.update_yaxes(title=dict(text="score rope(q, m) · rope(k, n)"))
    return fig

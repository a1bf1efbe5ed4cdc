"""Circuits: composition heatmaps, path-patching matrices, logit attribution bars, the circuit as a graph,
attribution patching against exact patching."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .style import MAX_WIDTH, PALETTE, SCALE, base_layout, cell_text, require, round_axis

VIA_COLOURS = {"k": PALETTE[1], "q": PALETTE[0], "v": PALETTE[2]}
VIA_NAMES = {"k": "keys", "q": "queries", "v": "values"}
# the integer columns that place a sender and a receiver (figures never parse a label)
LAYERS = ["sender_layer", "receiver_layer"]


def _positions(frame: pd.DataFrame, roles=("sender", "receiver")) -> dict[str, tuple[int, int]]:
    """{label: (layer, head)} of the frame's senders and receivers, read from their integer
    `<role>_layer` / `<role>_head` columns (head -1 or missing: not a head), never from the label."""
    where: dict[str, tuple[int, int]] = {}
    for role in roles:
        heads = frame[f"{role}_head"].fillna(-1) if f"{role}_head" in frame.columns else -1
        for label, layer, head in zip(frame[role], frame[f"{role}_layer"], pd.Series(heads, index=frame.index)):
            where.setdefault(label, (int(layer), int(head)))
    return where


def _order(frame: pd.DataFrame, role: str) -> list[str]:
    """The frame's distinct `role` labels, in (layer, head) order."""
    where = _positions(frame, (role,))
    return sorted(where, key=where.get)


def composition_heatmap(frame: pd.DataFrame, title: str = "Composition scores") -> go.Figure:
    """Senders (rows) x receivers (columns) of `interp.composition_scores`; the colour bar marks the random
    baseline and the median of the model's own pairs (the baseline that discriminates), cells at or below
    the random baseline are left blank, and hovering shows each score's percentile among the model's pairs."""
    require(frame, ["sender", "receiver", "score", "baseline"] + LAYERS, "composition_heatmap")
    senders, receivers = _order(frame, "sender"), _order(frame, "receiver")
    grid = frame.pivot(index="sender", columns="receiver", values="score").reindex(index=senders, columns=receivers)
    pct = (frame.pivot(index="sender", columns="receiver", values="percentile").reindex(index=senders, columns=receivers)
           if "percentile" in frame.columns else grid * float("nan"))
    base, median = float(frame["baseline"].iloc[0]), float(frame["score"].median())
    shown = grid.where(grid > base)
    top = float(frame["score"].max())
    kind = frame["kind"].iloc[0] if "kind" in frame.columns else ""
    ticks = sorted({round(base, 3): f"random {base:.2f}", round(median, 3): f"median pair {median:.2f}",
                    round(top, 3): f"{top:.2f}"}.items())
    fig = go.Figure(go.Heatmap(
        z=shown.to_numpy(), x=receivers, y=senders, colorscale=SCALE, zmin=base, zmax=max(top, base * 1.01),
        text=cell_text(grid.to_numpy()), texttemplate="%{text}",
        customdata=[[f"{g / base:.1f}x the random baseline; {p:.0f}th percentile of the model's pairs" if g == g else ""
                     for g, p in zip(gr, pr)] for gr, pr in zip(grid.to_numpy(), pct.to_numpy())],
        colorbar=dict(title=dict(text="score"), tickvals=[t for t, _ in ticks], ticktext=[n for _, n in ticks],
                      x=1.0, xanchor="left", xpad=8),
        hovertemplate="%{y} -> %{x}<br>score %{text}<br>%{customdata}<extra></extra>",
    ))
    fig.update_layout(**base_layout(title, f"{kind.upper()}-composition, sender (row) into a later receiver (column); "
                                           f"blank: not above the random baseline {base:.3f}; the model's median pair "
                                           f"scores {median:.3f}",
                                    width=min(MAX_WIDTH, 300 + 46 * len(receivers)), height=200 + 30 * len(senders),
                                    margin=dict(l=70, r=170)))
    fig.update_yaxes(autorange="reversed", title=dict(text="sender"))
    fig.update_xaxes(title=dict(text="receiver"))
    return fig


def path_patching_matrix(frame: pd.DataFrame, value: str = "share_repeated", title: str = "Path patching") -> go.Figure:
    """Senders (rows) x (receiver, input) columns of `interp.induction_circuit`'s frame: each edge's share."""
    require(frame, ["sender", "receiver", "via", value] + LAYERS, "path_patching_matrix")
    df = frame.assign(column=frame["receiver"] + " " + frame["via"].map(VIA_NAMES))
    columns = [f"{r} {VIA_NAMES[v]}" for r in _order(df, "receiver") for v in ("q", "k", "v")]
    columns = [c for c in columns if c in set(df["column"])]
    senders = _order(df, "sender")
    grid = df.pivot(index="sender", columns="column", values=value).reindex(index=senders, columns=columns)
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=columns, y=senders, colorscale="RdBu", zmid=0, text=cell_text(grid.to_numpy(), "{:.3f}"),
        texttemplate="%{text}", colorbar=dict(title=dict(text="share")),
        hovertemplate="%{y} -> %{x}<br>share of the corruption's effect %{text}<extra></extra>",
    ))
    fig.update_layout(**base_layout(title, "each sender noised on the path into one input of one induction head only "
                                           "(share of the whole corruption's effect)",
                                    width=min(MAX_WIDTH, max(560, 220 + 70 * len(columns))), height=200 + 26 * len(senders)))
    fig.update_yaxes(autorange="reversed", title=dict(text="sender"))
    return fig


def dla_bars(frame: pd.DataFrame, seq: int = 0, pos: int = -1, top: int = 12, title: str = "Direct logit attribution") -> go.Figure:
    """The components with the largest shares of one position's logit (difference), from `interp.logit_attribution`."""
    require(frame, ["seq", "pos", "component", "kind", "attribution"], "dla_bars")
    rows = frame[frame["seq"] == seq]
    pos = int(rows["pos"].max()) if pos < 0 else pos
    rows = rows[rows["pos"] == pos]
    total = float(rows["attribution"].sum())
    rows = rows.reindex(rows["attribution"].abs().sort_values(ascending=False).index).head(top)
    colours = {"embed": PALETTE[4], "head": PALETTE[0], "mlp": PALETTE[2]}
    fig = go.Figure(go.Bar(
        x=rows["component"], y=rows["attribution"], marker_color=[colours[k] for k in rows["kind"]],
        hovertemplate="%{x}<br>%{y:.3f}<extra></extra>",
    ))
    fig.update_layout(**base_layout(title, f"position {pos}: the {len(rows)} largest shares of a total of {total:.2f} "
                                           "(blue: heads, green: MLPs, orange: embedding)", width=760, height=420))
    fig.update_yaxes(title=dict(text="share of the logit (difference)"))
    return fig


def circuit_graph(frame: pd.DataFrame, title: str = "Induction circuit") -> go.Figure:
    """Heads as nodes (x = layer, y = head), every feeding edge of `interp.induction_circuit` as a line
    whose width is its share on repeated tokens, coloured by the input it enters; members of an input's
    joint set that do not feed it alone (a `joint_order` column) are dashed, width = marginal share."""
    require(frame, ["sender", "receiver", "via", "share_repeated", "feeds"] + LAYERS, "circuit_graph")
    joint = frame["joint_order"] > 0 if "joint_order" in frame.columns else False
    edges = frame[frame["feeds"] | joint]
    where = {n: (layer, -head) for n, (layer, head) in _positions(frame).items()}
    nodes = sorted(where, key=lambda n: (where[n][0], -where[n][1]))
    fig = go.Figure()
    offsets = {"q": 0.12, "k": 0.0, "v": -0.12}
    for via in ("q", "k", "v"):
        for r in edges[edges["via"] == via].itertuples():
            (x0, y0), (x1, y1) = where[r.sender], where[r.receiver]
            backup = not r.feeds
            share = getattr(r, "marginal_share", r.share_repeated) if backup else r.share_repeated
            fig.add_trace(go.Scatter(
                x=[x0, (x0 + x1) / 2, x1], y=[y0, (y0 + y1) / 2 + offsets[via], y1], mode="lines",
                line=dict(color=VIA_COLOURS[via], width=1 + 10 * min(abs(share), 1.0), dash="dash" if backup else None),
                name=VIA_NAMES[via], legendgroup=via, showlegend=False,
                hovertemplate=f"{r.sender} -> {r.receiver} ({VIA_NAMES[via]})<br>share {r.share_repeated:.3f}"
                              + (f", marginal in the joint set {share:.3f}" if backup else "") + "<extra></extra>"))
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=VIA_COLOURS[via], width=4),
                                 name=f"into {VIA_NAMES[via]}", legendgroup=via))
    receivers = set(frame["receiver"])
    fig.add_trace(go.Scatter(
        x=[where[n][0] for n in nodes], y=[where[n][1] for n in nodes], mode="markers", text=nodes,
        showlegend=False, hovertemplate="%{text}<extra></extra>",
        marker=dict(size=[22 if n in receivers else 14 for n in nodes],
                    color=[PALETTE[3] if n in receivers else "#bbbbbb" for n in nodes]),
    ))
    # labels as annotations on a white box: drawn above every edge, so no edge crosses a label
    fig.layout.annotations = [dict(x=where[n][0], y=where[n][1], text=n, showarrow=False, yshift=17, bgcolor="white",
                                   borderpad=1, font=dict(size=11)) for n in nodes]
    fig.update_layout(**base_layout(title, "nodes: heads (purple: induction heads); edges: path-patching share, "
                                           "width proportional; dashed: in the joint set only (width: marginal share)",
                                    width=820, height=460))
    fig.update_xaxes(title=dict(text="layer"), dtick=1)
    fig.update_yaxes(title=dict(text="head"), tickvals=sorted({y for _, y in where.values()}),
                     ticktext=[str(-y) for y in sorted({y for _, y in where.values()})])
    return fig


def attribution_scatter(frame: pd.DataFrame, title: str = "Attribution patching against activation patching") -> go.Figure:
    """Each patch's gradient estimate (y) against its exact patched value (x), from
    `interp.attribution_patch(..., exact=True)`; the diagonal is perfect agreement."""
    require(frame, ["metric", "estimate", "label"], "attribution_scatter")
    lo = float(min(frame["metric"].min(), frame["estimate"].min()))
    hi = float(max(frame["metric"].max(), frame["estimate"].max()))
    r = float(frame["metric"].corr(frame["estimate"]))
    fig = go.Figure([
        go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#999", dash="dash"), name="exact = estimate"),
        go.Scatter(x=frame["metric"], y=frame["estimate"], mode="markers", text=frame["label"], name="patch",
                   marker=dict(color=PALETTE[0], size=6, opacity=0.7),
                   hovertemplate="%{text}<br>exact %{x:.3f}<br>estimate %{y:.3f}<extra></extra>"),
    ])
    fig.update_layout(**base_layout(title, f"{len(frame)} patches; Pearson r = {r:.3f}", width=620, height=520))
    fig.update_xaxes(title=dict(text="metric, exact patch"))
    fig.update_yaxes(title=dict(text="metric, attribution estimate"))
    return fig


def phase_change(frame: pd.DataFrame, title: str = "The induction phase change") -> go.Figure:
    """Measures against training tokens, one line each (previous-token score, induction score,
    K-composition, in-context-learning score; control pairs' K-composition thin and grey), from the
    experiment's snapshot table (`tokens`, `measure`, `value`). Percentile measures are left to the table."""
    require(frame, ["tokens", "measure", "value"], "phase_change")
    fig = go.Figure()
    shown = frame[~frame["measure"].str.endswith("percentile")]
    colour = 0
    for measure, rows in shown.groupby("measure", sort=False):
        rows = rows.sort_values("tokens")
        icl, control = measure.startswith("in-context"), measure.startswith("control")
        line = dict(color="#aaaaaa", width=1) if control else dict(color=PALETTE[colour % len(PALETTE)], dash="dash" if icl else None)
        colour += not control
        fig.add_trace(go.Scatter(x=rows["tokens"], y=rows["value"], name=measure, mode="lines" if control else "lines+markers",
                                 yaxis="y2" if icl else "y", line=line, legendgroup="control" if control else measure))
    fig.update_layout(**base_layout(title, "measured on each saved snapshot", width=1000, height=560,
                                    legend=dict(orientation="h", x=0, y=-0.18, xanchor="left", yanchor="top")))
    fig.update_layout(margin=dict(r=90, b=170),
                      yaxis=dict(title=dict(text="score (K-composition: x random)")),
                      yaxis2=dict(title=dict(text="ICL score (nats)", standoff=8), overlaying="y", side="right",
                                  showgrid=False, tickfont=dict(size=12), automargin=True,
                                  **round_axis(shown.loc[shown["measure"].str.startswith("in-context"), "value"])))
    fig.update_xaxes(title=dict(text="training tokens seen"))
    return fig

"""A node-link graph as one self-contained HTML page: attribution graphs and discovered circuits, one drawing code.

Plain data in, a page (a string) out: `nodes` (id, kind, layer, pos, label; optional url, detail, influence)
and `edges` (source, target, weight; optional label) DataFrames. Token positions (or any integer column)
run across, layers run up. The layout is computed here, in Python: every node is a box holding its label
(monospace, stretched to the box by `textLength`, so the box the browser draws is the box computed here),
placed in its layer's band as near its column as the boxes before it allow, in a new sub-row of the band
when it would not fit; so no two boxes overlap (`graph_layout`, tested by geometry). The page draws SVG
with a few dozen lines of plain JavaScript (`graph_assets`), fetches nothing (no CDN), and sets every
label through `textContent` (tokens are user text). Edges are blue when positive, red when negative, as
wide as their |weight|; a slider hides edges under a |weight| threshold and nodes left without edges;
clicking a node lists its incoming and outgoing edges and links its page (`url`). Supernodes (groups of
nodes) are drawn as one box with the group's edges summed (`merge_supernodes`).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, Optional, Sequence, Union

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from .graph_assets import CSS, SCRIPT, TEMPLATE

NODE_COLUMNS = ("id", "kind", "layer", "pos", "label")
EDGE_COLUMNS = ("source", "target", "weight")
COLOURS = {"feature": "#f6d38b", "error": "#c9c9c9", "token": "#e2e8f0", "logit": "#9ae6b4", "embed": "#e2e8f0",
           "head": "#a3bffa", "mlp": "#fbd38d", "logits": "#9ae6b4", "supernode": "#d6bcfa"}
ALWAYS = ("token", "logit", "embed", "logits")  # kinds shown at every slider position
POSITIVE, NEGATIVE = "#2b6cb0", "#c53030"
FONT_PX, CHAR_W = 11, 6.8  # label font and the width each character is stretched to (textLength)
PAD, GAP, BOX_H, ROW_GAP, BAND_GAP = 4, 3, 18, 4, 16
LEFT, RIGHT, TOP = 64, 8, 8
MAX_CHARS = 16
_SCHEME = re.compile(r"^\s*([a-zA-Z][a-zA-Z0-9+.-]*):")


def _require(frame: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{name} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} lacks column(s) {missing}; it has {list(frame.columns)}")


def shorten(text: str, n: int) -> str:
    """`text` cut to at most n characters (an ellipsis marks the cut); newlines and tabs shown as ↵ and →."""
    text = str(text).replace("\n", "↵").replace("\t", "→")
    return text if len(text) <= n else text[: max(n - 1, 0)] + "…"


def _order(nodes: pd.DataFrame) -> list[int]:
    """Row indices in placing order: by layer, then column, then the most important first."""
    weight = nodes["influence"].fillna(0).abs() if "influence" in nodes.columns else pd.Series(0.0, index=nodes.index)
    keys = pd.DataFrame({"layer": nodes["layer"].to_numpy(), "pos": nodes["pos"].to_numpy(), "w": -weight.to_numpy()})
    return list(keys.sort_values(["layer", "pos", "w"], kind="stable").index)


def _place(left: float, w: float, col_w: float, rights: list[float], right_edge: float) -> tuple[int, float]:
    """The sub-row and left edge of a box wanting `left`: the first sub-row where it fits within a column's
    drift of where it wants to be, else a new sub-row."""
    for sub, last in enumerate(rights):
        x = max(left, last + GAP)
        if x + w <= right_edge and x - left <= max(col_w, w):
            return sub, x
    return len(rights), min(max(left, LEFT), right_edge - w)


def graph_layout(nodes: pd.DataFrame, width: int = 1360, n_columns: Optional[int] = None) -> pd.DataFrame:
    """Boxes for the nodes: x, y (top-left), w, h, text (the label as drawn, shortened), subrow, in a page `width` wide.

    Args:
        nodes: id, kind, layer (the band, low at the bottom), pos (the column), label.
        width: the drawing's width in pixels.
        n_columns: columns across (default: the largest pos + 1).

    Returns:
        nodes with x, y, w, h, text, subrow (the sub-row in its band) added; no two boxes intersect.
    """
    _require(nodes, NODE_COLUMNS, "nodes")
    n_cols = max(int(n_columns or 0), int(nodes["pos"].max()) + 1 if len(nodes) else 1)
    area = width - LEFT - RIGHT
    col_w = area / n_cols
    max_chars = max(1, min(MAX_CHARS, int((area - 2 * PAD) // CHAR_W)))
    out = nodes.copy()
    out["text"] = [shorten(t, max_chars) for t in out["label"]]
    out["w"] = [len(t) * CHAR_W + 2 * PAD for t in out["text"]]
    out["h"] = float(BOX_H)
    x: dict[int, float] = {}
    sub: dict[int, int] = {}
    rights_of: dict[int, list[float]] = {}
    for i in _order(out):
        rights = rights_of.setdefault(int(out.at[i, "layer"]), [])
        w = float(out.at[i, "w"])
        want = LEFT + (int(out.at[i, "pos"]) + 0.5) * col_w - w / 2
        sub[i], x[i] = _place(want, w, col_w, rights, width - RIGHT)
        rights.append(0.0) if sub[i] == len(rights) else None
        rights[sub[i]] = x[i] + w
    out["x"], out["subrow"] = pd.Series(x), pd.Series(sub)
    out["y"] = _band_tops(out, rights_of)
    return out


def _band_tops(out: pd.DataFrame, rights_of: dict[int, list[float]]) -> pd.Series:
    """Each box's top edge: bands stacked from the bottom (lowest layer) up, sub-rows inside each band."""
    heights = {layer: len(r) * (BOX_H + ROW_GAP) for layer, r in rights_of.items()}
    total = sum(heights.values()) + BAND_GAP * len(heights)
    bottom, base = TOP + total, {}
    for layer in sorted(heights):
        bottom -= heights[layer]
        base[layer] = bottom  # the band's top
        bottom -= BAND_GAP
    ys = [base[int(layer)] + (len(rights_of[int(layer)]) - 1 - s) * (BOX_H + ROW_GAP)
          for layer, s in zip(out["layer"], out["subrow"])]
    return pd.Series(ys, index=out.index, dtype=float)


def boxes_overlap(layout: pd.DataFrame) -> list[tuple[str, str]]:
    """The pairs of node ids whose boxes intersect (empty for a good layout)."""
    b = layout[["x", "y", "w", "h"]].to_numpy()
    x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 0] + b[:, 2], b[:, 1] + b[:, 3]
    hit = (x0[:, None] < x1[None]) & (x0[None] < x1[:, None]) & (y0[:, None] < y1[None]) & (y0[None] < y1[:, None])
    i, j = np.nonzero(np.triu(hit, 1))
    ids = layout["id"].tolist()
    return [(ids[a], ids[b]) for a, b in zip(i, j)]


def merge_supernodes(nodes: pd.DataFrame, edges: pd.DataFrame,
                     supernodes: Sequence[tuple[str, Sequence[str]]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each group of nodes replaced by one node (kind "supernode", at its members' mean layer and column),
    edges into or out of a group summed per (source, target), edges inside a group dropped.

    Returns:
        (nodes, edges) with a `members` column on the nodes (the member ids, [] for plain nodes).
    """
    _require(nodes, NODE_COLUMNS, "nodes")
    _require(edges, EDGE_COLUMNS, "edges")
    owner = _owners(nodes, supernodes)
    groups = []
    for k, (label, members) in enumerate(supernodes):
        rows = nodes[nodes["id"].isin(list(members))]
        groups.append({"id": f"supernode-{k}", "kind": "supernode", "layer": int(round(rows["layer"].mean())),
                       "pos": int(round(rows["pos"].mean())), "label": str(label), "members": list(members),
                       "influence": rows["influence"].sum() if "influence" in rows else np.nan})
    kept = nodes[~nodes["id"].isin(owner)].copy()
    kept["members"] = [[] for _ in range(len(kept))]
    merged = pd.concat([kept, pd.DataFrame(groups)], ignore_index=True) if groups else kept.reset_index(drop=True)
    e = edges.copy()
    e["source"], e["target"] = e["source"].map(lambda s: owner.get(s, s)), e["target"].map(lambda t: owner.get(t, t))
    e = e[e["source"] != e["target"]]
    if supernodes:  # summed per pair: an edge's label no longer names one edge
        e = e.groupby(["source", "target"], as_index=False, sort=False)["weight"].sum()
    return merged, e.reset_index(drop=True)


def _owners(nodes: pd.DataFrame, supernodes: Sequence[tuple[str, Sequence[str]]]) -> dict[str, str]:
    known = set(nodes["id"])
    owner: dict[str, str] = {}
    for k, group in enumerate(supernodes):
        if len(group) != 2 or isinstance(group[1], str) or not len(group[1]):
            raise ValueError(f"supernodes[{k}] must be (label, [node ids]) with at least one id, got {group!r}")
        for m in group[1]:
            if m not in known:
                raise ValueError(f"supernode {group[0]!r} names node {m!r}, which is not among the nodes' ids")
            if m in owner:
                raise ValueError(f"node {m!r} is in two supernodes ({owner[m]} and supernode-{k})")
            owner[m] = f"supernode-{k}"
    return owner


def slider_steps(weights: Sequence[float], n: int = 40) -> list[float]:
    """The pruning slider's |weight| thresholds: 0 (every edge) then quantiles of |weight| up to the largest
    (the strongest edge alone), at most n, increasing."""
    a = np.sort(np.abs(np.asarray(weights, dtype=float)))
    if not len(a):
        return [0.0]
    qs = np.quantile(a, np.linspace(0, 1, max(2, n))[1:])
    return [0.0] + sorted({float(q) for q in qs if q > 0})


def edge_widths(weights: Sequence[float]) -> list[float]:
    """Stroke widths in pixels: 0.6 + 5.4 |w| / max |w| (so from 0.6 to 6)."""
    a = np.abs(np.asarray(weights, dtype=float))
    top = a.max() if len(a) and a.max() > 0 else 1.0
    return [round(float(0.6 + 5.4 * v / top), 3) for v in a]


def _check_url(url: Any, node: str) -> Optional[str]:
    if url is None or (isinstance(url, float) and math.isnan(url)) or url == "":
        return None
    m = _SCHEME.match(str(url))
    if m and m.group(1).lower() not in ("http", "https"):
        raise ValueError(f"node {node!r} has url {url!r}: only relative paths and http(s) links are allowed")
    return str(url)


def page_data(nodes: pd.DataFrame, edges: pd.DataFrame, width: int = 1360, n_columns: Optional[int] = None,
              rows: Optional[dict[int, str]] = None) -> dict[str, Any]:
    """What the page's script draws: nodes with their boxes, edges (s, t node indices, w, a = |w|, sw =
    stroke width), slider steps, row labels, colours. Edges are ordered by |w| (the strongest drawn last)."""
    _require(edges, EDGE_COLUMNS, "edges")
    lay = graph_layout(nodes, width, n_columns).reset_index(drop=True)
    index = {n: i for i, n in enumerate(lay["id"])}
    unknown = sorted({str(v) for v in pd.concat([edges["source"], edges["target"]]) if v not in index})
    if unknown:
        raise ValueError(f"edges name node(s) not among the nodes' ids: {unknown[:5]}")
    e = edges.assign(a=edges["weight"].abs()).sort_values("a", kind="stable").reset_index(drop=True)
    widths = edge_widths(e["weight"])
    data_edges = [{"s": index[r.source], "t": index[r.target], "w": float(r.weight), "a": float(r.a), "sw": sw,
                   "label": str(getattr(r, "label", "") or "")} for r, sw in zip(e.itertuples(), widths)]
    return {"nodes": [_node_data(r) for r in lay.to_dict("records")], "edges": data_edges,
            "steps": slider_steps(e["weight"]), "rows": _row_labels(lay, rows), "colors": COLOURS,
            "always": list(ALWAYS), "positive": POSITIVE, "negative": NEGATIVE,
            "height": float((lay["y"] + lay["h"]).max() + TOP) if len(lay) else 40.0, "width": width}


def _node_data(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "kind", "label", "text", "detail", "members")
    out: dict[str, Any] = {k: (str(r[k]) if k != "members" else [str(m) for m in r[k]])
                           for k in keep if k in r and _present(r[k])}
    out.update({k: round(float(r[k]), 2) for k in ("x", "y", "w", "h")})
    out.update(layer=int(r["layer"]), pos=int(r["pos"]), tw=round(len(r["text"]) * CHAR_W, 2),
               url=_check_url(r.get("url"), r["id"]))
    for k in ("influence", "activation"):
        if k in r and _present(r[k]):
            out[k] = float(r[k])
    return out


def _present(v: Any) -> bool:
    if isinstance(v, list):
        return bool(v)
    return not (v is None or (isinstance(v, float) and math.isnan(v)))


def _row_labels(lay: pd.DataFrame, rows: Optional[dict[int, str]]) -> list[dict[str, Any]]:
    out = []
    for layer, g in lay.groupby("layer"):
        label = (rows or {}).get(int(layer), f"L{int(layer)}")
        out.append({"label": str(label), "y": float((g["y"].min() + g["y"].max() + BOX_H) / 2)})
    return out


def json_for_script(data: Any) -> str:
    """JSON safe inside a <script> element: <, > and & written as \\u escapes (no `</script>` can close it)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def graph_page(nodes: pd.DataFrame, edges: pd.DataFrame, title: str, *, scores: Optional[Mapping[str, Union[float, int, str]]] = None,
               supernodes: Sequence[tuple[str, Sequence[str]]] = (), subtitle: str = "", width: int = 1360,
               n_columns: Optional[int] = None, rows: Optional[dict[int, str]] = None) -> str:
    """The graph as one self-contained HTML page (nothing fetched; every label escaped).

    Args:
        nodes: id, kind ("feature", "error", "token", "logit"; "embed", "head", "mlp", "logits"), layer, pos,
            label; optional url (the node's page: a relative path or an http(s) link), detail (shown on
            click), influence (orders nodes inside a cell), activation.
        edges: source, target (node ids), weight (signed); optional label (e.g. "k" for a key input).
        title: the page's title and heading.
        scores: numbers shown in the header, e.g. {"replacement score": 0.92}.
        supernodes: groups drawn as one box, each (label, [node ids]).
        subtitle: a line under the heading (e.g. the prompt).
        width: the drawing's width in pixels; n_columns: columns across; rows: {layer: row label}.

    Returns:
        the HTML text.
    """
    nodes, edges = merge_supernodes(nodes, edges, supernodes)
    data = page_data(nodes, edges, width, n_columns, rows)
    env = jinja2.Environment(autoescape=True)
    shown = [(k, f"{v:.3g}" if isinstance(v, (int, float)) else str(v)) for k, v in (scores or {}).items()]
    return env.from_string(TEMPLATE).render(title=title, subtitle=subtitle, scores=shown, css=CSS, script=SCRIPT,
                                            data=Markup(json_for_script(data)),
                                            n_nodes=len(data["nodes"]), n_edges=len(data["edges"]),
                                            n_steps=len(data["steps"]), width=width, height=data["height"],
                                            positive=POSITIVE, negative=NEGATIVE)

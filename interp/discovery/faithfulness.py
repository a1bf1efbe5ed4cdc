"""How good a ranking of edges is: MIB's faithfulness curve, its areas (CPR, CMD), and ROC AUC against a truth.

Faithfulness of a circuit C (Mueller et al. 2025, MIB): f(C) = (m(C) - m(empty)) / (m(model) - m(empty)),
where m(C) is the metric with every edge outside C ablated. The curve keeps the top k% of edges for
k in {0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100}. CPR is the area under f over that grid of fractions
(trapezoids; edges ranked by signed score; higher is better), CMD the area between f and 1 with edges
ranked by |score| (0 is best). A random ranking and the exact ranking are drawn beside the methods'.
ROC AUC of a ranking against a true edge set is the chance that a true edge scores above a false one
(|score|, ties count half): 1.0 is a perfect recovery.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int

from .discover import raw_scores
from .edges import EdgeGraph
from .patching import Metric, ablated_outputs, check_pair, circuit_metric, split_inputs

GRID = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
RANKINGS = ("signed", "absolute")


def _top(scores: np.ndarray, n: int, ranking: str) -> torch.Tensor:
    key = scores if ranking == "signed" else np.abs(scores)
    order = np.argsort(-key, kind="stable")
    keep = torch.zeros(len(scores))
    keep[torch.as_tensor(order[:n].copy())] = 1.0
    return keep


def _curve_rows(model: Any, graph: EdgeGraph, clean: torch.Tensor, ablated: torch.Tensor, metric: Metric,
                name: str, scores: np.ndarray, fractions: Sequence[float], ends: tuple[float, float]) -> list[tuple]:
    empty, full = ends
    rows = []
    for ranking in RANKINGS:
        for k in fractions:
            n = max(1, math.ceil(k * graph.n_edges))
            m = circuit_metric(model, graph, clean, ablated, metric, _top(scores, n, ranking))
            rows.append((name, ranking, k, n, m, (m - empty) / (full - empty) if full != empty else math.nan))
    return rows


def _rankings(scores: pd.DataFrame, n_edges: int) -> dict[str, np.ndarray]:
    if not {"method", "score"} <= set(scores.columns):
        raise ValueError(f"scores must be an edge_scores frame (columns method, score), got columns {list(scores.columns)}")
    out = {}
    for name, part in scores.groupby("method", sort=False):
        if len(part) != n_edges:
            raise ValueError(f"method {name!r} scores {len(part)} edges, the model's graph has {n_edges}")
        out[str(name)] = part["score"].to_numpy(dtype=float)
    return out


def faithfulness_curve(model: Any, clean: Int[torch.Tensor, "batch pos"], corrupted: Optional[Int[torch.Tensor, "batch pos"]],
                       metric: Metric, scores: Optional[pd.DataFrame] = None, ablation: str = "resample",
                       fractions: Sequence[float] = GRID, baselines: Iterable[str] = ("random", "exact"),
                       seed: int = 0) -> pd.DataFrame:
    """MIB's faithfulness curve of each method's ranking, beside a random and the exact ranking.

    Args:
        model, clean, corrupted, metric, ablation: as `edge_scores` (the same task the scores were made on).
        scores: an `edge_scores` frame, one or more methods stacked (or None: baselines only).
        fractions: the fractions of edges kept, each in (0, 1] (default MIB's 0.1% ... 100%).
        baselines: any of "random" (a seeded random ranking) and "exact" (exact patching's scores).

    Returns:
        one row per method, ranking ("signed", "absolute") and fraction: method, ranking, fraction,
        n_edges, metric, faithfulness.
    """
    check_pair(clean, corrupted, ablation)
    if not fractions or any(isinstance(k, bool) or not 0 < k <= 1 for k in fractions):
        raise ValueError(f"fractions of edges kept must each be in (0, 1], got {list(fractions)}")
    with split_inputs(model) as graph:
        outs, ablated = ablated_outputs(model, graph, clean, corrupted, ablation)
        ranks = {} if scores is None else _rankings(scores, graph.n_edges)
        for base in baselines:
            if base == "random":
                ranks["random"] = np.random.default_rng(seed).standard_normal(graph.n_edges)
            elif base == "exact":
                ranks.setdefault("exact", raw_scores(model, graph, clean, outs, ablated, metric, "exact").cpu().numpy())
            else:
                raise ValueError(f"unknown baseline {base!r}; choose from 'random', 'exact'")
        n = graph.n_edges
        ends = (circuit_metric(model, graph, clean, ablated, metric, torch.zeros(n)),
                circuit_metric(model, graph, clean, ablated, metric, torch.ones(n)))
        rows = [row for name, s in ranks.items()
                for row in _curve_rows(model, graph, clean, ablated, metric, name, s, sorted(fractions), ends)]
    return pd.DataFrame(rows, columns=["method", "ranking", "fraction", "n_edges", "metric", "faithfulness"])


def faithfulness_areas(curve: pd.DataFrame) -> pd.DataFrame:
    """CPR (area under f, signed ranking) and CMD (area of |1 - f|, absolute ranking) per method of a curve.

    Returns:
        one row per method: method, cpr, cmd (trapezoids over the curve's fractions)."""
    rows = []
    for name, part in curve.groupby("method", sort=False):
        signed = part[part["ranking"] == "signed"].sort_values("fraction")
        absolute = part[part["ranking"] == "absolute"].sort_values("fraction")
        cpr = float(np.trapezoid(signed["faithfulness"], signed["fraction"])) if len(signed) > 1 else math.nan
        cmd = float(np.trapezoid((1 - absolute["faithfulness"]).abs(), absolute["fraction"])) if len(absolute) > 1 else math.nan
        rows.append((name, cpr, cmd))
    return pd.DataFrame(rows, columns=["method", "cpr", "cmd"])


def roc_auc(scores: pd.DataFrame, truth: Iterable[tuple[str, str, str]]) -> pd.Series:
    """ROC AUC of each method's |score| ranking against a true edge set.

    Args:
        scores: an `edge_scores` frame (one or more methods).
        truth: the true edges as (sender, receiver, via) triples.

    Returns:
        AUC per method (a Series indexed by method), 1.0 when every true edge outscores every other.
    """
    true = {tuple(t) for t in truth}
    out = {}
    for name, part in scores.groupby("method", sort=False):
        keys = list(zip(part["sender"], part["receiver"], part["via"]))
        missing = true - set(keys)
        if missing:
            raise ValueError(f"true edges not in the graph: {sorted(missing)}")
        label = np.array([k in true for k in keys])
        if label.all() or not label.any():
            raise ValueError("the truth must hold some edges of the graph and leave some out")
        mag = pd.Series(part["score"].abs().to_numpy()).rank(method="average").to_numpy()
        n_pos, n_neg = label.sum(), (~label).sum()
        out[name] = float((mag[label].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return pd.Series(out, name="roc_auc")

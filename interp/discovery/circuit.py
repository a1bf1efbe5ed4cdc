"""One entry point per question: `edge_scores` (a score for every edge) and `discover` (a circuit).

Methods: "exact" (one forward per edge, the reference), "eap", "eap-ig-inputs" (alias "eap-ig"),
"eap-ig-activations", "acdc" (threshold sweep), "edge-pruning" (alias "mask"). Every score has one
sign convention: metric(clean) - metric(that edge ablated), so an edge the task needs scores positive
and circuits are picked by |score|.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pandas as pd
import torch

from .._core.inputs import TextOrTokens
from .edges import EdgeGraph
from .gradients import eap, eap_ig_activations, eap_ig_inputs
from .patching import Metric, ablated_outputs, exact_scores, split_inputs, token_pair
from .search import acdc_scores, mask_scores

METHODS = ("exact", "eap", "eap-ig-inputs", "eap-ig-activations", "acdc", "edge-pruning")
ALIASES = {"eap-ig": "eap-ig-inputs", "mask": "edge-pruning", "ig": "eap-ig-inputs"}


def method_name(method: str) -> str:
    """The canonical name of `method` (aliases resolved); a clear error for an unknown one."""
    key = method.lower().replace("_", "-") if isinstance(method, str) else method
    name = ALIASES.get(key, key)
    if name not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS} (or {sorted(ALIASES)})")
    return name


def raw_scores(model: Any, graph: EdgeGraph, clean: torch.Tensor, outs: torch.Tensor, ablated: torch.Tensor,
               metric: Metric, method: str, steps: Optional[int] = None, taus: Optional[Sequence[float]] = None) -> torch.Tensor:
    """Scores [edge] of one canonical method (flags already on, sender outputs computed)."""
    if method == "exact":
        return exact_scores(model, graph, clean, ablated, metric)
    if method == "eap":
        return eap(model, graph, clean, outs, ablated, metric)
    if method == "eap-ig-inputs":
        return eap_ig_inputs(model, graph, clean, outs, ablated, metric, 5 if steps is None else steps)
    if method == "eap-ig-activations":
        return eap_ig_activations(model, graph, clean, outs, ablated, metric, 5 if steps is None else steps)
    if method == "acdc":
        return acdc_scores(model, graph, clean, ablated, metric, taus)
    return mask_scores(model, graph, clean, ablated, metric, steps=200 if steps is None else steps)


def edge_scores(model: Any, clean: TextOrTokens, corrupted: Optional[TextOrTokens],
                metric: Metric, method: str = "eap-ig", ablation: str = "resample", steps: Optional[int] = None,
                taus: Optional[Sequence[float]] = None) -> pd.DataFrame:
    """A score for every edge of the model's edge graph by one method.

    Args:
        model: a hooked model with split inputs (Sprout, the walkthrough GPT); its flags are restored after.
        clean: token ids [batch, pos] the task runs on.
        corrupted: counterfactual token ids [batch, pos] for ablation="resample" (None for mean/zero).
        metric: logits [batch, pos, vocab] -> a 0-d tensor, higher = the task done better (differentiable
            for the gradient methods and edge pruning).
        method: "exact", "eap", "eap-ig" / "eap-ig-inputs", "eap-ig-activations", "acdc", "edge-pruning".
        ablation: "resample", "mean" or "zero" (see `interp.discovery.patching`).
        steps: EAP-IG's points on the path (default 5); edge pruning's optimiser steps (default 200).
        taus: ACDC's thresholds as fractions of the metric's full range (default 16 from 1e-4 to 0.5).

    Returns:
        one row per edge: sender, receiver, via, sender_layer, receiver_layer, score, method. `score`
        estimates metric(clean) - metric(edge ablated) (exact, EAP, EAP-IG), or ranks the same way
        (ACDC: the largest surviving threshold; edge pruning: the learned mask weight in (0, 1)).

    Example:
        >>> from interp.discovery.planted import induction_metric, induction_pair, planted_model
        >>> model = planted_model("induction")
        >>> clean, corrupted = induction_pair()
        >>> frame = edge_scores(model, clean, corrupted, induction_metric(clean), method="eap-ig")
        >>> top = frame.sort_values("score").iloc[-1]
        >>> (top.sender, top.receiver, top.via) in {
        ...     ("L1H0", "logits", "logits"), ("L0H0", "L1H0", "k"), ("embed", "L1H0", "v")}
        True
    """
    name = method_name(method)
    clean, corrupted = token_pair(model, clean, corrupted, ablation)
    with split_inputs(model) as graph:
        outs, ablated = ablated_outputs(model, graph, clean, corrupted, ablation)
        scores = raw_scores(model, graph, clean, outs, ablated, metric, name, steps, taus)
    frame = graph.edges
    frame["score"] = scores.double().cpu().numpy()
    frame["method"] = name
    return frame


@dataclass
class Circuit:
    """A circuit found by `discover`: every edge with its score and whether it is in, and the nodes.

    edges: sender, receiver, via, sender_layer, receiver_layer, score, method, in_circuit (one row per edge).
    nodes: node, kind ("embed", "head", "mlp", "logits"), layer, in_circuit (touched by a kept edge).
    """

    edges: pd.DataFrame
    nodes: pd.DataFrame
    method: str
    ablation: str

    @property
    def kept(self) -> pd.DataFrame:
        """The circuit's edges only."""
        return self.edges[self.edges["in_circuit"]].reset_index(drop=True)

    @property
    def edge_set(self) -> set[tuple[str, str, str]]:
        """The circuit's edges as (sender, receiver, via) triples, e.g. ("L0H0", "L1H0", "k")."""
        kept = self.kept
        return set(zip(kept["sender"], kept["receiver"], kept["via"]))

    def __repr__(self) -> str:
        return f"Circuit({self.method}, {self.ablation} ablation: {int(self.edges['in_circuit'].sum())} of {len(self.edges)} edges)"


def select(scores: pd.DataFrame, budget: Optional[float] = None, threshold: Optional[float] = None) -> pd.Series:
    """Which edges are in the circuit: the top `budget` fraction by |score|, or |score| >= `threshold`.

    With neither: ACDC's edges that survive its smallest threshold, edge pruning's edges with a mask
    above 1/2, and for the other methods |score| >= 1% of the largest."""
    if budget is not None and threshold is not None:
        raise ValueError("give budget (a fraction of edges) or threshold (a score), not both")
    magnitude = scores["score"].abs()
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
            raise ValueError(f"budget is the fraction of edges kept and must be in (0, 1], got {budget!r}")
        n = max(1, math.ceil(budget * len(scores)))
        rank = magnitude.rank(method="first", ascending=False)
        return rank <= n
    if threshold is not None:
        return magnitude >= threshold
    method = scores["method"].iloc[0]
    if method == "acdc":
        return scores["score"] > 0
    if method == "edge-pruning":
        return scores["score"] > 0.5
    return magnitude >= 0.01 * magnitude.max()


def node_table(edges: pd.DataFrame, n_layers: int, n_heads: int) -> pd.DataFrame:
    """The nodes of the graph, with whether a kept edge touches each."""
    touched = set(edges.loc[edges["in_circuit"], "sender"]) | set(edges.loc[edges["in_circuit"], "receiver"])
    rows = [("embed", "embed", -1)]
    for l in range(n_layers):
        rows += [(f"L{l}H{h}", "head", l) for h in range(n_heads)] + [(f"MLP{l}", "mlp", l)]
    rows.append(("logits", "logits", n_layers))
    frame = pd.DataFrame(rows, columns=["node", "kind", "layer"])
    frame["in_circuit"] = frame["node"].isin(touched)
    return frame


def discover(model: Any, clean: TextOrTokens, corrupted: Optional[TextOrTokens],
             metric: Metric, method: str = "eap-ig", ablation: str = "resample", budget: Optional[float] = None,
             threshold: Optional[float] = None, steps: Optional[int] = None, taus: Optional[Sequence[float]] = None) -> Circuit:
    """Find the circuit for a task: `edge_scores` by `method`, then the edges kept by budget or threshold.

    Args:
        model, clean, corrupted, metric, method, ablation, steps, taus: as `edge_scores`.
        budget: the fraction of edges to keep, in (0, 1] (top by |score|).
        threshold: keep edges with |score| >= threshold instead (not with budget).

    Returns:
        a `Circuit`: `.edges` (every edge, score, in_circuit), `.nodes`, `.kept` (the circuit's edges).
    """
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1):
        raise ValueError(f"budget is the fraction of edges kept and must be in (0, 1], got {budget!r}")
    scores = edge_scores(model, clean, corrupted, metric, method, ablation, steps, taus)
    scores["in_circuit"] = select(scores, budget, threshold).to_numpy()
    nodes = node_table(scores, int(model.cfg.n_layers), int(model.cfg.n_heads))
    return Circuit(scores, nodes, scores["method"].iloc[0], ablation)

"""Pruning a graph to the nodes and edges that carry most of the influence on the logits, and the two
scores of how much of that influence the dictionaries explain (circuit-tracer's definitions).

With A the adjacency, Â = |A| with each row (target) scaled to sum 1, and w the logit nodes' weights
(their probabilities; zero elsewhere), a node's influence is I = w Â + w Â² + ... (the graph is acyclic,
so the series ends). Pruning keeps the fewest nodes holding `node_threshold` of the total influence
(tokens and logits always), then scores each edge of the graph on those nodes by Â[t, s] (I_t + w_t),
keeps the fewest edges holding `edge_threshold` of the total score, and drops, until nothing changes,
feature and error nodes left without a kept outgoing edge and features left without a kept incoming one.

Scores (on the unpruned graph): replacement = Σ_tokens I / (Σ_tokens I + Σ_errors I), the share of the
influence from the input that reaches the logits without passing an error node; completeness =
Σ_j (1 - Σ_errors Â[j, e]) (I_j + w_j) / Σ_j (I_j + w_j), each node's non-error share of its input,
weighted by its influence (token and error nodes have no input and count as complete, as in circuit-tracer).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float

from .graph import Graph


@dataclass
class PrunedGraph:
    """What `prune_graph` keeps.

    Attributes:
        node_mask: [n_nodes] the nodes kept.
        edge_mask: [n_nodes, n_nodes] the edges kept (rows targets, columns sources), only between kept nodes.
        cumulative_influence: [n_nodes] each node's cumulative share of the total influence at its rank
            (what the graph page's pruning slider filters on).
        influence: [n_nodes] each node's influence I.
    """

    node_mask: Bool[torch.Tensor, " n_nodes"]
    edge_mask: Bool[torch.Tensor, "n_nodes n_nodes"]
    cumulative_influence: Float[torch.Tensor, " n_nodes"]
    influence: Float[torch.Tensor, " n_nodes"]


def normalised_adjacency(adjacency: Float[torch.Tensor, "n n"]) -> Float[torch.Tensor, "n n"]:
    """|A| with each row scaled to sum 1 (rows of zeros stay zero)."""
    a = adjacency.abs()
    return a / a.sum(1, keepdim=True).clamp_min(1e-30)


def influence(normalised: Float[torch.Tensor, "n n"], weights: Float[torch.Tensor, " n"]) -> Float[torch.Tensor, " n"]:
    """w Â + w Â² + ...: every node's influence on the weighted targets (Â must be acyclic)."""
    current = weights @ normalised
    total = current.clone()
    for _ in range(normalised.shape[0]):
        if not bool(current.any()):
            return total
        current = current @ normalised
        total += current
    if bool(current.any()):
        raise ValueError("the adjacency has a cycle: influence does not vanish along paths, so it is no attribution graph")
    return total


def logit_weights(graph: Graph) -> Float[torch.Tensor, " n_nodes"]:
    """w: the logit nodes' probabilities, zero at every other node."""
    w = torch.zeros(graph.n_nodes, dtype=graph.adjacency_matrix.dtype)
    w[graph.slices()["logit"]] = graph.logit_probabilities.to(w.dtype)
    return w


def _keep_fraction(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Mask of the highest scores whose sum first reaches `fraction` of the total (ties at the cut kept)."""
    flat = scores.reshape(-1)
    ordered = flat.sort(descending=True).values
    total = ordered.sum()
    if total <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    cum = ordered.cumsum(0) / total
    k = int(torch.searchsorted(cum, torch.tensor([fraction], dtype=cum.dtype)).item())
    k = min(k, int((ordered > 0).sum()) - 1)
    return scores >= ordered[max(k, 0)]


def _check_threshold(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a fraction in [0, 1], got {value!r}")


def prune_graph(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PrunedGraph:
    """The nodes and edges that hold `node_threshold` / `edge_threshold` of the influence (module docstring).

    Example:
        >>> pruned = interp.prune_graph(graph)                                     # doctest: +SKIP
        >>> int(pruned.node_mask.sum()), int(pruned.edge_mask.sum())               # doctest: +SKIP
    """
    _check_threshold("node_threshold", node_threshold)
    _check_threshold("edge_threshold", edge_threshold)
    s, w = graph.slices(), logit_weights(graph)
    inf = influence(normalised_adjacency(graph.adjacency_matrix), w)
    node_mask = _keep_fraction(inf, node_threshold)
    node_mask[s["token"].start:] = True  # tokens and logits always
    kept = graph.adjacency_matrix * node_mask[:, None] * node_mask[None, :]
    a = normalised_adjacency(kept)
    edge_scores = a * (influence(a, w) + w)[:, None]
    edge_mask = _keep_fraction(edge_scores, edge_threshold) & (edge_scores > 0)
    _drop_dangling(node_mask, edge_mask, s["token"].start, s["error"].start)
    order = inf.argsort(descending=True)
    cumulative = torch.zeros_like(inf)
    cumulative[order] = inf[order].cumsum(0) / inf.sum().clamp_min(1e-30)
    return PrunedGraph(node_mask, edge_mask, cumulative, inf)


def _drop_dangling(node_mask: torch.Tensor, edge_mask: torch.Tensor, token_start: int, n_features: int) -> None:
    """Drop, until stable, features and errors without a kept outgoing edge and features without a kept
    incoming one (in place)."""
    while True:
        edge_mask &= node_mask[:, None] & node_mask[None, :]
        before = node_mask.clone()
        node_mask[:token_start] &= edge_mask[:, :token_start].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
        if torch.equal(before, node_mask):
            return


def graph_scores(graph: Graph, pruned: bool = True, node_threshold: float = 0.8,
                 edge_threshold: float = 0.98) -> pd.DataFrame:
    """Replacement and completeness scores (module docstring) of the full graph and, with `pruned`, of the
    pruned graph, where each dropped feature or error node is merged into the error node of its layer and
    position (its edges become error edges, so what pruning loses counts against the scores).

    Returns:
        DataFrame with one row per graph ("full", "pruned"): graph, replacement, completeness, n_features,
        n_edges (non-zero edges kept).
    """
    rows = [dict(graph="full", **_scores(graph, graph.adjacency_matrix), n_features=graph.n_features,
                 n_edges=int((graph.adjacency_matrix != 0).sum()))]
    if pruned:
        p = prune_graph(graph, node_threshold, edge_threshold)
        merged = _merge_pruned(graph, p)
        rows.append(dict(graph="pruned", **_scores(graph, merged),
                         n_features=int(p.node_mask[graph.slices()["feature"]].sum()), n_edges=int(p.edge_mask.sum())))
    return pd.DataFrame(rows)


def _scores(graph: Graph, adjacency: torch.Tensor) -> dict[str, float]:
    s, w = graph.slices(), logit_weights(graph)
    a = normalised_adjacency(adjacency)
    inf = influence(a, w)
    tokens, errors = inf[s["token"]].sum(), inf[s["error"]].sum()
    replacement = tokens / (tokens + errors).clamp_min(1e-30)
    weight = inf + w
    completeness = ((1 - a[:, s["error"]].sum(1)) * weight).sum() / weight.sum().clamp_min(1e-30)
    return {"replacement": float(replacement), "completeness": float(completeness)}


def _merge_pruned(graph: Graph, p: PrunedGraph) -> torch.Tensor:
    """The adjacency with pruned features' and errors' outgoing edges moved onto the error node of their
    (layer, position), and their rows emptied."""
    adj = graph.adjacency_matrix.clone()
    s = graph.slices()
    feats = graph.active_features[graph.selected_features]
    dropped = (~p.node_mask[:s["token"].start]).nonzero(as_tuple=True)[0].tolist()
    for node in dropped:
        if node < s["error"].start:  # a feature: its effects become its error node's, it has no inputs
            layer, pos = int(feats[node, 0]), int(feats[node, 1])
            adj[:, graph.error_node(layer, pos)] += adj[:, node]
            adj[:, node] = 0
            adj[node] = 0
    return adj

"""A graph as circuit-tracer's graph JSON: the page format its frontend and Neuronpedia read.

The file is {"metadata", "qParams", "nodes", "links"} (Neuronpedia's graph schema, schema_version 1),
holding the pruned graph (`prune_graph`): its kept nodes (tokens and logits always) and kept edges.
Node ids follow circuit-tracer: a feature "{layer}_{feature}_{pos}" (its `feature` field the Cantor
pairing of layer and feature, type "cross layer transcoder" for every transcoder, as there), an error
"0_{layer}_{pos}" (type "mlp reconstruction error"), a token "E_{vocab id}_{pos}" (layer "E", type
"embedding"), a logit "{n_layers + 1}_{vocab id}_{pos}" (type "logit", label `Output "tok" (p=0.123)`).
Circuit-tracer's error id can equal a feature's (layer 0, feature = the error's layer, same position);
where it would, the error takes "{layer}_-1_{pos}" instead, so every id names one node. `influence` is
the node's cumulative influence share (what the page's pruning slider filters on).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from .graph import Graph
from .prune import PrunedGraph, prune_graph

FEATURE, ERROR, TOKEN, LOGIT = "cross layer transcoder", "mlp reconstruction error", "embedding", "logit"


def cantor(x: int, y: int) -> int:
    """The Cantor pairing of two naturals (circuit-tracer's `feature` of a feature node)."""
    return (x + y) * (x + y + 1) // 2 + y


def node_ids(graph: Graph) -> list[str]:
    """Every node's circuit-tracer id, in node order (module docstring)."""
    feats = graph.active_features[graph.selected_features].tolist()
    ids = [f"{layer}_{feat}_{pos}" for layer, pos, feat in feats]
    taken = set(ids)
    for layer in range(graph.n_layers):
        for pos in range(graph.n_pos):
            plain = f"0_{layer}_{pos}"
            ids.append(plain if plain not in taken else f"{layer}_-1_{pos}")
    ids += [f"E_{int(t)}_{p}" for p, t in enumerate(graph.input_tokens.tolist())]
    ids += [f"{graph.n_layers + 1}_{i}_{graph.n_pos - 1}" for _, i in graph.logit_targets]
    return ids


def graph_json(graph: Graph, slug: str, *, node_threshold: float = 0.8, edge_threshold: float = 0.98,
               supernodes: Sequence[tuple[str, Sequence[int]]] = (), labels: Optional[dict[int, str]] = None,
               pruned: Optional[PrunedGraph] = None) -> dict[str, Any]:
    """The graph as circuit-tracer's graph JSON (a dict; `json.dump` it to `<slug>.json`).

    Args:
        graph: an attribution graph.
        slug: the graph's name in the page (letters, digits, '-' and '_').
        node_threshold, edge_threshold: pruning (`prune_graph`); or give `pruned` already computed.
        supernodes: groups of nodes, each (label, node indices), written to qParams.supernodes.
        labels: {node index: label} for nodes' `clerp` (a feature's description).

    Returns:
        {"metadata", "qParams", "nodes", "links"}.
    """
    if not isinstance(slug, str) or not slug or not all(c.isalnum() or c in "-_" for c in slug):
        raise ValueError(f"slug must be a non-empty name of letters, digits, '-' and '_', got {slug!r}")
    p = pruned if pruned is not None else prune_graph(graph, node_threshold, edge_threshold)
    ids = node_ids(graph)
    kept = p.node_mask.nonzero(as_tuple=True)[0].tolist()
    links = _links(graph, p, ids)
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    kinds = graph._kind_of_nodes()
    nodes = [_node(graph, i, ids[i], kinds[i], float(p.cumulative_influence[i]), (labels or {}).get(i, ""))
             for i in kept if ids[i] in linked or kinds[i] in ("token", "logit")]
    return {"metadata": _metadata(graph, slug, node_threshold, edge_threshold),
            "qParams": {"pinnedIds": [], "supernodes": _supernodes(supernodes, ids), "linkType": "both",
                        "clickedId": "", "sg_pos": ""},
            "nodes": nodes, "links": links}


def _links(graph: Graph, p: PrunedGraph, ids: list[str]) -> list[dict[str, Union[str, float]]]:
    target, source = p.edge_mask.nonzero(as_tuple=True)
    weights = graph.adjacency_matrix[target, source].tolist()
    return [{"source": ids[s], "target": ids[t], "weight": w} for s, t, w in zip(source.tolist(), target.tolist(), weights)]


def _node(graph: Graph, i: int, node_id: str, kind: str, influence: float, label: str) -> dict[str, Any]:
    s = graph.slices()
    base = {"node_id": node_id, "token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0,
            "clerp": label, "influence": influence, "activation": None}
    if kind == "feature":
        a = int(graph.selected_features[i])
        layer, pos, feat = graph.active_features[a].tolist()
        return {**base, "feature": cantor(layer, feat), "layer": str(layer), "ctx_idx": pos, "feature_type": FEATURE,
                "jsNodeId": f"{layer}_{feat}-0", "activation": float(graph.activation_values[a])}
    if kind == "error":
        layer, pos = divmod(i - s["error"].start, graph.n_pos)
        return {**base, "feature": -1, "layer": str(layer), "ctx_idx": pos, "feature_type": ERROR,
                "jsNodeId": f"{layer}_{pos}-0" if node_id.startswith("0_") else f"{layer}_-1-{pos}"}
    if kind == "token":
        pos = i - s["token"].start
        vocab = int(graph.input_tokens[pos])
        return {**base, "feature": pos, "layer": "E", "ctx_idx": pos, "feature_type": TOKEN, "jsNodeId": f"E_{vocab}-{pos}"}
    k = i - s["logit"].start
    text, vocab = graph.logit_targets[k]
    prob = float(graph.logit_probabilities[k])
    return {**base, "feature": vocab, "layer": str(graph.n_layers + 1), "ctx_idx": graph.n_pos - 1, "feature_type": LOGIT,
            "jsNodeId": f"L_{vocab}-{graph.n_pos - 1}", "token_prob": prob, "is_target_logit": k == 0,
            "clerp": label or f'Output "{text}" (p={prob:.3f})'}


def _metadata(graph: Graph, slug: str, node_threshold: float, edge_threshold: float) -> dict[str, Any]:
    toks = graph.input_token_strings or [f"#{int(t)}" for t in graph.input_tokens]
    return {"slug": slug, "scan": graph.scan or "unknown", "transcoder_list": [], "prompt_tokens": toks,
            "prompt": graph.input_string, "node_threshold": node_threshold, "schema_version": 1,
            "info": {"creator": "sprout-interp", "generator": {"name": "interp.attribute"}},
            "generation_settings": {k: v for k, v in graph.info.items() if isinstance(v, (int, float, str))},
            "pruning_settings": {"node_threshold": node_threshold, "edge_threshold": edge_threshold}}


def _supernodes(supernodes: Sequence[tuple[str, Sequence[int]]], ids: list[str]) -> list[list[str]]:
    out = []
    for item in supernodes:
        label, members = item
        bad = [m for m in members if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < len(ids)]
        if bad:
            raise ValueError(f"supernode {label!r} names node(s) {bad} outside the graph (0..{len(ids) - 1})")
        out.append([str(label)] + [ids[m] for m in members])
    return out

"""The Graph's tables and files, and the circuit-tracer graph JSON export."""
import json

import pytest
import torch

from interp.graphs import Graph, ReplacementModel, attribute, graph_json, prune_graph
from tests.interp.graphs.test_prune import hand_graph
from tests.interp.graphs.tiny import random_transcoders, tiny_sprout

# the fields of circuit-tracer's frontend models (Metadata, QParams, Node, Link)
METADATA = {"slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold", "schema_version"}
QPARAMS = {"pinnedIds", "supernodes", "linkType", "clickedId", "sg_pos"}
NODE = {"node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit", "run_idx",
        "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation"}


@pytest.fixture(scope="module")
def graph():
    model = tiny_sprout()
    rm = ReplacementModel(model, random_transcoders(model))
    return attribute(rm, torch.randint(0, 256, (6,), generator=torch.Generator().manual_seed(0)), max_n_logits=3)


def test_nodes_and_edges_frames(graph):
    nodes = graph.nodes
    assert len(nodes) == graph.n_nodes
    assert nodes.kind.value_counts().to_dict() == {"feature": graph.n_features, "error": 2 * 6, "token": 6, "logit": 3}
    feats = nodes[nodes.kind == "feature"]
    want = graph.active_features[graph.selected_features]
    assert feats[["layer", "pos", "feature"]].values.tolist() == want.tolist()
    assert feats.activation.tolist() == graph.activation_values[graph.selected_features].tolist()
    logits = nodes[nodes.kind == "logit"]
    assert logits.probability.tolist() == graph.logit_probabilities.tolist()
    edges = graph.edges(0.05)
    assert (edges.weight.abs() > 0.05).all() and edges.weight.abs().is_monotonic_decreasing
    assert len(edges) == int((graph.adjacency_matrix.abs() > 0.05).sum())
    row = edges.iloc[0]
    assert graph.adjacency_matrix[row.target, row.source].item() == row.weight
    assert nodes.kind[row.source] == row.source_kind and nodes.kind[row.target] == row.target_kind


def test_save_and_load(graph, tmp_path):
    graph.save(tmp_path / "g")
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["graph.json", "graph.safetensors"]
    back = Graph.load(tmp_path / "g")
    assert torch.equal(back.adjacency_matrix, graph.adjacency_matrix)
    assert back.logit_targets == graph.logit_targets and back.scan == graph.scan
    assert back.nodes.equals(graph.nodes)


def test_load_errors(graph, tmp_path):
    with pytest.raises(FileNotFoundError, match="graph.json"):
        Graph.load(tmp_path / "nothing")
    folder = graph.save(tmp_path / "g")
    meta = json.loads((folder / "graph.json").read_text())
    (folder / "graph.json").write_text(json.dumps({**meta, "format": "other"}))
    with pytest.raises(ValueError, match="format"):
        Graph.load(folder)
    (folder / "graph.json").write_text(json.dumps({**meta, "logit_targets": meta["logit_targets"][:1]}))
    with pytest.raises(ValueError, match="inconsistent"):
        Graph.load(folder)
    (folder / "graph.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Graph.load(folder)


def test_graph_json_has_circuit_tracers_fields_and_the_pruned_edges(graph):
    out = json.loads(json.dumps(graph_json(graph, "tiny-1", supernodes=[("group", [0, 1])])))
    assert set(out) == {"metadata", "qParams", "nodes", "links"}
    assert METADATA <= set(out["metadata"]) and set(out["qParams"]) == QPARAMS
    assert all(set(n) == NODE for n in out["nodes"])
    ids = [n["node_id"] for n in out["nodes"]]
    assert len(ids) == len(set(ids))
    p = prune_graph(graph)
    assert len(out["links"]) == int(p.edge_mask.sum())
    by_id = {n["node_id"]: n for n in out["nodes"]}
    assert all(link["source"] in by_id and link["target"] in by_id for link in out["links"])
    assert sum(n["feature_type"] == "embedding" for n in out["nodes"]) == graph.n_pos
    logits = [n for n in out["nodes"] if n["feature_type"] == "logit"]
    assert [n["is_target_logit"] for n in logits] == [True, False, False]
    assert logits[0]["node_id"] == f"3_{graph.logit_targets[0][1]}_5" and logits[0]["clerp"].startswith("Output ")
    from interp.graphs.export import node_ids
    index = {i: k for k, i in enumerate(node_ids(graph))}
    for link in out["links"]:
        assert link["weight"] == graph.adjacency_matrix[index[link["target"]], index[link["source"]]].item()
    for n in out["nodes"]:
        if n["feature_type"] == "cross layer transcoder":
            layer, feat, pos = map(int, n["node_id"].split("_"))
            assert n["feature"] == (layer + feat) * (layer + feat + 1) // 2 + feat and n["ctx_idx"] == pos
    assert out["qParams"]["supernodes"][0] == ["group"] + node_ids(graph)[:2]


def test_error_ids_never_alias_a_feature():
    g = hand_graph()  # features (0, 1, 5) and (1, 1, 7): ids 0_5_1 and 1_7_1
    g.active_features[0] = torch.tensor([0, 1, 1])  # now "0_1_1", circuit-tracer's id of the error at layer 1, pos 1
    from interp.graphs.export import node_ids
    ids = node_ids(g)
    assert len(set(ids)) == len(ids)
    assert ids[g.error_node(1, 1)] == "1_-1_1" and ids[g.error_node(1, 0)] == "0_1_0"

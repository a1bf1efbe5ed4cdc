"""The circuit-tracer peer benchmark's comparison puts two graphs of one prompt in one node order whatever
order each lists its features in, finds any difference, refuses graphs with other nodes, and without
circuit-tracer says why instead of measuring (the run with it: tests/interop/test_circuit_tracer_attribute.py)."""
import dataclasses
import importlib.util

import pytest
import torch

import interp
from benchmarks import graphs_peer
from tests.interp.graphs.tiny import random_transcoders, tiny_sprout


@pytest.fixture(scope="module")
def graph():
    model = tiny_sprout()
    return interp.attribute(model, torch.tensor([0, 5, 9, 17, 5, 9, 40]), random_transcoders(model))


def reordered(graph, features):
    """The same graph with its selected features listed in the order `features` (a permutation)."""
    n_sel, n = graph.n_features, graph.adjacency_matrix.shape[0]
    p = torch.cat([features, torch.arange(n_sel, n)])
    return dataclasses.replace(graph, selected_features=graph.selected_features[features],
                               adjacency_matrix=graph.adjacency_matrix[p][:, p])


def test_a_graph_with_its_features_in_another_order_agrees_exactly(graph):
    assert graph.n_features > 20
    flipped = reordered(graph, torch.arange(graph.n_features).flip(0))
    assert not torch.equal(flipped.adjacency_matrix, graph.adjacency_matrix)
    got = graphs_peer.agreement(graph, flipped)
    assert got == {"nodes": graph.n_nodes, "features": graph.n_features, "max_abs": 0.0, "max_row_rel": 0.0,
                   "same_support": True}


def test_a_changed_edge_is_found_with_its_size(graph):
    other = dataclasses.replace(graph, adjacency_matrix=graph.adjacency_matrix.clone())
    rows = graph.slices()["logit"]
    row = other.adjacency_matrix[rows.start]
    j = int(row.abs().argmax())
    row[j] *= 1.5  # half the largest entry of that row
    got = graphs_peer.agreement(graph, other)
    assert got["max_row_rel"] == pytest.approx(0.5) and got["max_abs"] == pytest.approx(0.5 * abs(float(row[j])) / 1.5)
    zeroed = dataclasses.replace(graph, adjacency_matrix=graph.adjacency_matrix.clone())
    zeroed.adjacency_matrix[rows.start, j] = 0
    assert not graphs_peer.agreement(graph, zeroed)["same_support"]


def test_graphs_with_other_features_are_refused(graph):
    fewer = graph.n_features - 1
    n = graph.adjacency_matrix.shape[0]
    keep = torch.cat([torch.arange(fewer), torch.arange(graph.n_features, n)])
    smaller = dataclasses.replace(graph, selected_features=graph.selected_features[:fewer],
                                  adjacency_matrix=graph.adjacency_matrix[keep][:, keep])
    with pytest.raises(ValueError, match="different nodes"):
        graphs_peer.agreement(graph, smaller)


@pytest.mark.skipif(importlib.util.find_spec("circuit_tracer") is not None, reason="circuit-tracer is installed here")
def test_without_circuit_tracer_the_run_says_why():
    assert graphs_peer.run(["gpt-4"], 32, 256, 1).startswith("circuit-tracer: skipped, circuit-tracer is not importable")

"""The edge graph: counts by the formula and the issue's numbers, one row per edge, the dense/flat views."""
import doctest
import importlib

import pytest
import torch

from interp.discovery import edge_graph
from interp.discovery.edges import EdgeGraph
from sprout import Sprout, SproutConfig


def formula(L, H):
    """ACDC's and EAP-IG's count: each head's q, k, v and each MLP read every earlier writer; the logits read all."""
    return sum(3 * H * (1 + l * (H + 1)) + (1 + l * (H + 1) + H) for l in range(L)) + 1 + L * (H + 1)


@pytest.mark.parametrize("L,H,expected", [(1, 3, 18), (4, 3, 309), (4, 4, 479), (8, 4, 1997), (2, 3, 75)])
def test_counts(L, H, expected):
    assert formula(L, H) == expected
    graph = EdgeGraph(L, H)
    assert graph.n_edges == expected == len(graph.edges)
    assert graph.counts["total"] == expected
    assert graph.counts["logits"] == 1 + L * (H + 1)


def test_edge_graph_of_a_sprout_and_its_rows():
    model = Sprout(SproutConfig(vocab_size=32, context=16, n_layer=2, n_head=2, d_model=16, d_ff=16))
    graph = edge_graph(model)
    frame = graph.edges
    assert graph.n_edges == formula(2, 2)
    # every receiver reads exactly the senders before it: L1's heads read embed, L0H0, L0H1, MLP0
    assert set(frame[(frame.receiver == "L1H1") & (frame.via == "k")].sender) == {"embed", "L0H0", "L0H1", "MLP0"}
    assert set(frame[frame.receiver == "MLP0"].sender) == {"embed", "L0H0", "L0H1"}
    assert frame[frame.receiver == "L0H0"].sender.unique().tolist() == ["embed"]
    same_layer = frame[frame.sender_layer == frame.receiver_layer]
    assert same_layer.receiver.str.startswith("MLP").all() and (frame.sender_layer <= frame.receiver_layer).all()
    values = torch.arange(graph.n_edges, dtype=torch.float64)
    assert torch.equal(graph.flat(graph.dense(values)), values)
    assert graph.edge_ids([("L0H1", "L1H0", "v")]) == [frame.index[(frame.sender == "L0H1") & (frame.receiver == "L1H0")
                                                                   & (frame.via == "v")][0]]


@pytest.mark.parametrize("name", ["interp.discovery.edges", "interp.discovery.discover"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0

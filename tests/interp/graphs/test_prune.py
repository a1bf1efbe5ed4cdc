"""Pruning and scores on a hand-built graph whose influences are worked out by hand (module docstring of
interp.graphs.prune for the definitions), and against an independent influence by matrix inverse."""
import pytest
import torch

from interp.graphs import Graph, graph_scores, prune_graph

# nodes: f0 (layer 0, pos 1), f1 (layer 1, pos 1) | errors e00 e01 e10 e11 | tokens t0 t1 | logit
F0, F1, E00, E01, E10, E11, T0, T1, LOGIT = range(9)


def hand_graph(extra_feature: bool = False) -> Graph:
    n = 9 + extra_feature
    off = int(extra_feature)  # a third feature f2 (layer 0, pos 1) shifts every later index by one
    idx = {k: (k if k <= F1 else k + off) for k in range(9)}
    A = torch.zeros(n, n, dtype=torch.float64)
    A[idx[LOGIT], idx[F1]], A[idx[LOGIT], idx[E11]] = 3.0, -1.0
    A[idx[F1], idx[F0]], A[idx[F1], idx[T1]], A[idx[F1], idx[E01]] = 2.0, 1.0, 1.0
    A[idx[F0], idx[T1]], A[idx[F0], idx[T0]] = 1.0, -1.0
    active = [[0, 1, 5], [1, 1, 7]] + ([[0, 1, 9]] if extra_feature else [])
    if extra_feature:
        A[idx[F1], 2] = 0.01  # f2 -> f1, tiny
        A[2, idx[T1]] = 1.0
    return Graph(input_string="ab", input_tokens=torch.tensor([1, 2]), active_features=torch.tensor(active),
                 selected_features=torch.arange(len(active)), activation_values=torch.ones(len(active)),
                 adjacency_matrix=A, logit_targets=[("c", 3)], logit_probabilities=torch.tensor([1.0]),
                 vocab_size=10, n_layers=2)


def inverse_influence(A, w):
    a = A.abs()
    a = a / a.sum(1, keepdim=True).clamp_min(1e-30)
    n = a.shape[0]
    return w @ a @ torch.linalg.inv(torch.eye(n, dtype=a.dtype) - a), a


def test_influence_and_scores_by_hand():
    g = hand_graph()
    want = {F1: 0.75, E11: 0.25, F0: 0.375, T1: 0.375, E01: 0.1875, T0: 0.1875}
    pruned = prune_graph(g)
    for node in range(9):
        assert pruned.influence[node].item() == pytest.approx(want.get(node, 0.0), abs=1e-12)
    scores = graph_scores(g, pruned=False).iloc[0]
    assert scores.replacement == pytest.approx(0.5625, abs=1e-12)  # tokens 0.5625 / (0.5625 + errors 0.4375)
    assert scores.completeness == pytest.approx(2.6875 / 3.125, abs=1e-12)


def test_pruning_by_hand():
    g = hand_graph()
    p = prune_graph(g, node_threshold=0.8, edge_threshold=0.98)
    # cumulative shares 0.353, 0.529, 0.706, 0.824 reach 0.8 at e11: f1, f0, t1, e11 kept; tokens and logits always
    assert p.node_mask.tolist() == [True, True, False, False, False, True, True, True, True]
    assert p.cumulative_influence[F1].item() == pytest.approx(0.75 / 2.125)
    assert p.cumulative_influence[E11].item() == pytest.approx(1.75 / 2.125)
    kept = {(int(t), int(s)) for t, s in p.edge_mask.nonzero()}
    assert kept == {(LOGIT, F1), (LOGIT, E11), (F1, F0), (F1, T1), (F0, T1), (F0, T0)}
    # edge scores (after dropping e01) 0.75, 0.5, 0.25 x 4: half the total is reached at f1 <- f0, and
    # then f0 has no kept input, f1 loses its only kept input, and everything but tokens and logit goes
    p = prune_graph(g, node_threshold=0.8, edge_threshold=0.5)
    assert p.node_mask.tolist() == [False] * 6 + [True] * 3
    assert not p.edge_mask.any()


def test_scores_agree_with_an_inverse_and_pruned_features_merge_into_errors():
    g = hand_graph(extra_feature=True)
    w = torch.zeros(10, dtype=torch.float64)
    w[-1] = 1.0
    inf, a = inverse_influence(g.adjacency_matrix, w)
    torch.testing.assert_close(prune_graph(g).influence, inf)
    p = prune_graph(g)
    assert not p.node_mask[2]  # f2 is dropped: its edge into f1 becomes e01's (layer 0, pos 1)
    merged = g.adjacency_matrix.clone()
    merged[:, E01 + 1] += merged[:, 2]
    merged[:, 2] = 0
    merged[2] = 0
    inf_m, a_m = inverse_influence(merged, w)
    errors = slice(3, 7)
    tokens = slice(7, 9)
    want_replacement = inf_m[tokens].sum() / (inf_m[tokens].sum() + inf_m[errors].sum())
    want_completeness = ((1 - a_m[:, errors].sum(1)) * (inf_m + w)).sum() / (inf_m + w).sum()
    scores = graph_scores(g).set_index("graph")
    assert scores.loc["pruned", "replacement"] == pytest.approx(want_replacement.item(), abs=1e-12)
    assert scores.loc["pruned", "completeness"] == pytest.approx(want_completeness.item(), abs=1e-12)
    assert scores.loc["pruned", "replacement"] < scores.loc["full", "replacement"]


def test_thresholds_are_checked():
    with pytest.raises(ValueError, match="node_threshold"):
        prune_graph(hand_graph(), node_threshold=1.5)
    with pytest.raises(ValueError, match="edge_threshold"):
        prune_graph(hand_graph(), edge_threshold=-0.1)

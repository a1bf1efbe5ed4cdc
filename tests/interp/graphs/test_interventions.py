"""Interventions in the real model beside the graph's predictions."""
import pytest
import torch

from interp.graphs import ReplacementModel, attribute, intervene
from interp.graphs.interventions import REGIMES
from tests.interp.graphs.tiny import random_transcoders, tiny_sprout


@pytest.fixture(scope="module")
def made():
    model = tiny_sprout()
    rm = ReplacementModel(model, random_transcoders(model))
    graph = attribute(rm, torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(4)), max_n_logits=3)
    return rm, graph


def test_a_last_layer_feature_with_attention_and_norms_frozen_moves_the_logits_as_predicted(made):
    """Past the last MLP the frozen model is linear, so the measured change is the graph's edge, exactly;
    with live norms it is not (the test can fail)."""
    rm, graph = made
    feats = graph.active_features[graph.selected_features]
    last = [i for i in range(graph.n_features) if feats[i, 0] == graph.n_layers - 1][:2]
    frame = intervene(rm, graph, last, scale=3.0, n_random=2)
    chosen = frame[frame.intervention == "chosen"]
    frozen = chosen[chosen.regime == REGIMES[0]]
    assert len(frozen) == graph.n_logits
    torch.testing.assert_close(torch.tensor(frozen.measured.values), torch.tensor(frozen.predicted_direct.values),
                               atol=1e-10, rtol=0)
    torch.testing.assert_close(torch.tensor(frozen.predicted_total.values), torch.tensor(frozen.predicted_direct.values))
    # by hand: twice the summed columns of the two features in the logit rows
    want = 2 * graph.adjacency_matrix[graph.slices()["logit"]][:, last].sum(1)
    torch.testing.assert_close(torch.tensor(frozen.predicted_direct.values), want)
    free = chosen[chosen.regime == "free"]
    assert (free.measured - free.predicted_direct).abs().max() > 1e-8


def test_setting_features_to_their_own_values_changes_nothing_and_random_groups_match_in_activation(made):
    rm, graph = made
    node = 3
    act = float(graph.activation_values[graph.selected_features[node]])
    frame = intervene(rm, graph, [node], value=act, n_random=3, seed=1)
    assert set(frame.intervention) == {"chosen", "random 0", "random 1", "random 2"}
    assert set(frame.regime) == set(REGIMES)
    chosen = frame[frame.intervention == "chosen"]
    assert chosen.measured.abs().max() < 1e-12 and chosen.predicted_total.abs().max() < 1e-12
    acts = graph.activation_values[graph.selected_features]
    nearest = (acts - acts[node]).abs().argsort()[:6].tolist()
    for nodes in frame[frame.intervention != "chosen"].nodes:
        assert len(nodes) == 1 and nodes[0] != node and nodes[0] in nearest


def test_bad_interventions_are_refused(made):
    rm, graph = made
    with pytest.raises(ValueError, match="exactly one"):
        intervene(rm, graph, [0])
    with pytest.raises(ValueError, match="not feature nodes"):
        intervene(rm, graph, [graph.n_features], scale=2.0)

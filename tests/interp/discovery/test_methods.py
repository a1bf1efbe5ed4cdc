"""The gradient methods against independent computations, and what `discover` and the faithfulness curve return."""
import itertools

import numpy as np
import pandas as pd
import pytest
import torch

import interp
from interp.discovery import edge_scores, faithfulness_areas, faithfulness_curve, roc_auc
from interp.discovery.patching import ablated_outputs, circuit_metric, split_inputs
from interp.discovery.planted import induction_metric, induction_pair, planted_model, truth
from tests.interp.discovery.conftest import metric


def test_eap_is_the_derivative_of_patching(model, pair):
    """EAP's score of an edge = d/de [metric(clean) - metric(edge weighted 1 - e)] at e = 0, by central
    differences (the norms compute in float32, so e is 1e-3, not smaller)."""
    clean, corrupted = pair
    eap = edge_scores(model, clean, corrupted, metric, method="eap")
    eps = 1e-3
    with split_inputs(model) as graph:
        _, ablated = ablated_outputs(model, graph, clean, corrupted, "resample")
        for e in (0, 7, 17, 40, 77, graph.n_edges - 1):
            ends = []
            for sign in (1, -1):
                keep = torch.ones(graph.n_edges, dtype=torch.float64)
                keep[e] = 1 + sign * eps
                ends.append(circuit_metric(model, graph, clean, ablated, metric, keep))
            slope = (ends[0] - ends[1]) / (2 * eps)
            assert eap.score[e] == pytest.approx(slope, rel=1e-2, abs=1e-3)
    assert eap.score.abs().max() > 1e-3


@pytest.mark.parametrize("method", ["eap-ig-inputs", "eap-ig-activations"])
def test_eap_ig_of_one_step_is_eap(model, pair, method):
    """With one step the path is its clean end alone: EAP-IG is EAP."""
    clean, corrupted = pair
    eap = edge_scores(model, clean, corrupted, metric, method="eap").score.to_numpy()
    ig = edge_scores(model, clean, corrupted, metric, method=method, steps=1).score.to_numpy()
    np.testing.assert_allclose(ig, eap, rtol=1e-9, atol=1e-12)
    many = edge_scores(model, clean, corrupted, metric, method=method, steps=4).score.to_numpy()
    assert not np.allclose(many, eap)


def test_roc_auc_counts_pairs():
    """AUC = the share of (true, false) pairs where the true edge's |score| is higher (ties half), counted by hand."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"sender": [f"s{i}" for i in range(12)], "receiver": "logits", "via": "logits",
                          "score": np.round(rng.standard_normal(12), 1), "method": "m"})
    true = {(f"s{i}", "logits", "logits") for i in (1, 4, 5, 9)}
    mag = frame.score.abs().to_numpy()
    pos, neg = [mag[i] for i in (1, 4, 5, 9)], [mag[i] for i in range(12) if i not in (1, 4, 5, 9)]
    by_hand = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)])
    assert roc_auc(frame, true)["m"] == pytest.approx(by_hand)
    with pytest.raises(ValueError, match="not in the graph"):
        roc_auc(frame, {("nope", "logits", "logits")})


@pytest.fixture(scope="module")
def planted_curve():
    model = planted_model("induction")
    clean, corrupted = induction_pair(n_seqs=4)
    scores = edge_scores(model, clean, corrupted, induction_metric(clean), method="eap-ig")
    curve = faithfulness_curve(model, clean, corrupted, induction_metric(clean), scores, fractions=(0.01, 0.1, 0.5, 1.0))
    return model, clean, corrupted, scores, curve


def test_faithfulness_curve_on_the_planted_circuit(planted_curve):
    model, clean, corrupted, scores, curve = planted_curve
    assert set(curve.method) == {"eap-ig-inputs", "random", "exact"}
    assert np.allclose(curve[curve.fraction == 1.0].faithfulness, 1.0)  # every edge kept is the model
    # 10% of 75 edges = 8 >= the 5 planted ones: exact and EAP-IG keep the whole circuit, a random pick does not
    tenth = curve[(curve.fraction == 0.1) & (curve.ranking == "absolute")].set_index("method").faithfulness
    assert tenth["exact"] == pytest.approx(1.0, abs=0.02) and tenth["eap-ig-inputs"] == pytest.approx(1.0, abs=0.02)
    assert tenth["random"] < 0.5
    areas = faithfulness_areas(curve).set_index("method")
    assert areas.loc["eap-ig-inputs", "cmd"] < areas.loc["random", "cmd"]
    assert areas.loc["eap-ig-inputs", "cpr"] > areas.loc["random", "cpr"]
    # CPR by hand: trapezoids over the fractions of the signed ranking
    signed = curve[(curve.method == "exact") & (curve.ranking == "signed")].sort_values("fraction")
    f, x = signed.faithfulness.to_numpy(), signed.fraction.to_numpy()
    assert areas.loc["exact", "cpr"] == pytest.approx(float(((f[1:] + f[:-1]) / 2 * np.diff(x)).sum()))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        faithfulness_curve(model, clean, corrupted, induction_metric(clean), scores, fractions=(0.0, 0.5))


def test_discover_returns_a_drawable_circuit(planted_curve):
    model, clean, corrupted, _, _ = planted_curve
    circuit = interp.discover(model, clean, corrupted, induction_metric(clean), method="eap-ig", budget=5 / 75)
    assert set(zip(circuit.kept.sender, circuit.kept.receiver, circuit.kept.via)) == truth("induction")
    assert set(circuit.nodes[circuit.nodes.in_circuit].node) == {"embed", "L0H0", "L1H0", "logits"}
    assert list(circuit.edges.columns) == ["sender", "receiver", "via", "sender_layer", "receiver_layer", "score", "method",
                                           "in_circuit"]
    by_threshold = interp.discover(model, clean, corrupted, induction_metric(clean), method="eap-ig", threshold=0.1)
    assert set(zip(by_threshold.kept.sender, by_threshold.kept.receiver, by_threshold.kept.via)) == truth("induction")

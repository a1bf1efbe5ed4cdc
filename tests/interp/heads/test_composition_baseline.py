"""Composition percentiles: each score ranked among the model's own pairs, computed independently."""
import numpy as np
import pytest

import interp
from interp.heads.composition import circuits, pair_scores
from tests.interp.planted import planted_model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_percentiles_rank_each_score_among_all_pairs(planted, kind):
    frame = interp.composition_scores(planted, kind)
    scores = frame["score"].to_numpy()
    finite = scores[~np.isnan(scores)]  # a planted head that writes nothing has no score (0 / 0)
    hand = np.array([100 * (finite <= s).mean() if s == s else np.nan for s in scores])
    assert frame["percentile"].to_numpy() == pytest.approx(hand, nan_ok=True)
    # the controls: every pair whose receiver sits in the same layer (another head) or an earlier one
    QK, OV = circuits(planted)
    right = {"q": QK, "k": QK.T, "v": OV}[kind]
    full = pair_scores(OV, right).numpy()  # [L, H, L, H]
    L, H = full.shape[:2]
    control = np.array([full[sl, sh, rl, rh] for sl in range(L) for sh in range(H) for rl in range(L) for rh in range(H)
                        if rl <= sl and (sl, sh) != (rl, rh)])
    control = control[~np.isnan(control)]
    want = [100 * (control <= s).mean() if s == s else np.nan for s in scores]
    assert frame["control_percentile"].to_numpy() == pytest.approx(want, nan_ok=True)


def test_the_planted_key_edge_tops_both_distributions(planted):
    k = interp.composition_scores(planted, "k").set_index(["sender", "receiver"])
    assert k.loc[("L0H0", "L1H0"), "percentile"] == 100.0
    assert k.loc[("L0H0", "L1H0"), "control_percentile"] == 100.0
    assert k.loc[("L0H1", "L1H0"), "percentile"] < 100  # the decoy writes where no key reads: tied at the bottom

"""The phase-change measures: each equals the quantity it names, computed independently."""
import pandas as pd
import pytest
import torch

import interp
from sprout import Sprout, SproutConfig

from ..planted import planted_model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return Sprout(SproutConfig(vocab_size=64, context=160, n_layer=2, n_head=2, d_model=32, d_ff=64)).eval()


def test_icl_score_is_late_minus_early_loss(small):
    ids = torch.randint(0, 64, (3, 140), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = small(ids[:, :128])
    logp = torch.log_softmax(logits.double(), -1)
    nll = -logp.gather(-1, ids[:, 1:129, None])[..., 0]  # position t predicts token t + 1
    expected = nll[:, 112:128].mean() - nll[:, 8:24].mean()
    assert interp.icl_score(small, ids) == pytest.approx(float(expected), abs=1e-4)


def test_icl_score_refuses_short_windows(small):
    with pytest.raises(ValueError, match="129"):
        interp.icl_score(small, torch.zeros(2, 100, dtype=torch.long))


def test_phase_measures_follow_the_named_heads(planted):
    prev = interp.head_scores(planted, "previous_token").set_index(["layer", "head"])["score"]
    ind = interp.head_scores(planted, "induction").set_index(["layer", "head"])["score"]
    comp = interp.composition_scores(planted, "k").set_index(["sender", "receiver"])
    for pair in [("L0H0", "L1H0"), ("L0H1", "L1H2"), ("L1H2", "L1H0")]:
        m = interp.phase_measures(planted, heads=pair)
        (pl, ph), (il, ih) = [(int(x[1]), int(x[3])) for x in pair]
        assert m["previous-token score"] == pytest.approx(float(prev[(pl, ph)]))
        assert m["induction score"] == pytest.approx(float(ind[(il, ih)]))
        if il > pl:
            row = comp.loc[pair]
            assert m["K-composition (x random)"] == pytest.approx(float(row.score / row.baseline))
        else:  # no composition between heads of one layer
            assert "K-composition (x random)" not in m
    # the planted key edge composes far above the decoy's unread slot
    assert (interp.phase_measures(planted, heads=("L0H0", "L1H0"))["K-composition (x random)"]
            > 3 * interp.phase_measures(planted, heads=("L0H1", "L1H0"))["K-composition (x random)"])


def test_phase_heads_pick_an_induction_head_and_an_earlier_previous_token_head(planted):
    prev, ind = interp.phase_heads(planted)
    assert ind in ("L1H0", "L1H1")  # the induction head and its decoy attend identically
    assert prev in ("L0H0", "L0H1")  # L1H2 attends to the previous token too, but is not below the receiver


@pytest.mark.parametrize("heads, match", [(("L0H0", "L9H0"), "layer"), (("MLP0", "L1H0"), "heads"),
                                          (("L0H0", "nonsense"), "cannot read")])
def test_phase_measures_refuse_bad_heads(planted, heads, match):
    with pytest.raises(ValueError, match=match):
        interp.phase_measures(planted, heads=heads)


def test_phase_table_is_tidy():
    table = interp.phase_table({200: {"a": 1.0, "b": 2.0}, 100: {"a": 0.5}})
    assert table.to_dict("list") == {"tokens": [100, 200, 200], "measure": ["a", "a", "b"], "value": [0.5, 1.0, 2.0]}


def test_control_pairs_and_their_measures(planted):
    controls = interp.control_pairs(planted, ("L0H0", "L1H0"))
    assert controls == [("L0H0", "L1H1"), ("L0H0", "L1H2"), ("L0H1", "L1H0"), ("L0H2", "L1H0")]
    m = interp.phase_measures(planted, heads=("L0H0", "L1H0"), controls=controls)
    comp = interp.composition_scores(planted, "k").set_index(["sender", "receiver"])
    for s, r in controls:
        row = comp.loc[(s, r)]
        # a planted head that writes nothing has no composition (0 / 0): NaN, the same both ways
        assert m[f"control {s} -> {r}: K-composition (x random)"] == pytest.approx(float(row.score / row.baseline), nan_ok=True)
        assert m[f"control {s} -> {r}: K-composition percentile"] == pytest.approx(float(row.percentile), nan_ok=True)
    # the planted edge stands above every control, and at the top of the model's pairs
    assert m["K-composition percentile"] == 100.0 * 6 / 6
    ratio = {(s, r): m[f"control {s} -> {r}: K-composition (x random)"] for s, r in controls}
    # L1H1 is built to read its keys exactly as L1H0 does: that control composes just as much
    assert ratio.pop(("L0H0", "L1H1")) == pytest.approx(m["K-composition (x random)"])
    assert all(m["K-composition (x random)"] > 3 * x for x in ratio.values() if x == x)


def table(tokens, values, measure="induction score"):
    return pd.DataFrame({"tokens": tokens, "measure": measure, "value": values})


def test_phase_change_is_resolved_only_with_a_snapshot_inside_the_change():
    step = interp.phase_change(table([0, 100, 200, 300], [0.0, 0.0, 1.0, 1.0]))
    assert (step["start_tokens"], step["end_tokens"], step["inside"]) == (100, 200, 0)
    assert not step["resolved"] and not step["abrupt"] and "do not resolve" in step["text"]
    sampled = interp.phase_change(table([0, 100, 190, 195, 200, 300], [0.0, 0.0, 0.3, 0.7, 1.0, 1.0]))
    assert sampled["resolved"] and sampled["abrupt"]  # 190 -> 200 holds 70% of the way, with 195 inside
    assert (sampled["start_tokens"], sampled["end_tokens"], sampled["inside"]) == (190, 200, 1)
    ramp = interp.phase_change(table(list(range(0, 1100, 100)), [i / 10 for i in range(11)]))
    assert ramp["resolved"] and not ramp["abrupt"]  # half the way takes half the run: gradual
    falling = interp.phase_change(table([0, 10, 20, 30, 40, 50], [0.0, 0.0, -0.6, -1.2, -1.8, -2.0]))
    assert falling["extreme"] == -2.0 and falling["resolved"] and falling["start_tokens"] in (10, 20)
    flat = interp.phase_change(table([0, 10], [0.5, 0.5]))
    assert not flat["resolved"]
    with pytest.raises(ValueError, match="at least two"):
        interp.phase_change(table([0], [0.1]))

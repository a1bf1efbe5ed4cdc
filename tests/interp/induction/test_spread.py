"""The circuit over a spread of settings, on the planted model whose one key edge is known."""
import pytest

import interp
from tests.interp.planted import planted_model


@pytest.fixture(scope="module")
def spread():
    return interp.circuit_spread(planted_model(), receivers=["L1H0"], seeds=(0, 1), half_lens=(6, 12), story_seeds=())


def test_every_setting_is_measured_for_every_earlier_head_and_input(spread):
    settings = spread.groupby(["data", "seed", "length"]).ngroups
    assert settings == 4 and sorted(spread["length"].unique()) == [12, 24]
    assert len(spread) == settings * 3 * 3  # inputs x the three heads of layer 0
    assert set(spread["data"]) == {"repeated"}


def test_the_planted_key_edge_holds_at_every_setting_and_the_sentences_say_so(spread):
    ranges = interp.spread_ranges(spread).set_index(["receiver", "via", "sender"])
    edge = ranges.loc[("L1H0", "k", "L0H0")]
    assert edge["in_joint_set"] == edge["settings"] == 4
    assert edge["own_min"] > 0.3 and edge["marginal_min"] > 0.3
    keys = spread[(spread["via"] == "k") & (spread["joint_order"] > 0)]
    assert set(keys["sender"]) == {"L0H0"}  # no decoy joins the key set anywhere
    text = interp.spread_sentences(spread)
    assert "Over 4 settings (repeated random tokens of seeds 0, 1 at lengths 2x6, 2x12)" in text
    line = next(line for line in text.splitlines() if "L1H0's keys" in line)
    assert "in it at every setting: L0H0 (alone" in line and "L0H1" not in line
    own = spread[(spread["via"] == "k") & (spread["sender"] == "L0H0")]["own_share"]
    assert f"alone {own.min():.2f}-{own.max():.2f}" in line


def test_no_induction_head_gives_an_empty_spread():
    model = planted_model()
    empty = interp.circuit_spread(model, min_score=1.01)
    assert empty.empty and interp.spread_sentences(empty) == "no induction head to measure"

"""The parameter table: the chapter's numbers for Sprout, and totals equal to num_params for any config."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import interp
from sprout import PRESETS, Sprout, SproutConfig


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_total_equals_num_params(name):
    cfg = SproutConfig.preset(name)
    t = interp.param_table(cfg, name).set_index("part")
    assert t.loc["total", "count"] == Sprout(cfg).num_params()
    assert t["share"].drop("total").sum() == pytest.approx(1.0)


def test_the_chapters_sprout_numbers():
    t = interp.param_table(SproutConfig.preset("sprout"), "sprout").set_index("part")
    assert t.loc["total", "count"] == 17_309_056
    assert t.loc["embedding", "count"] == 3_145_728
    assert t.loc["attention", "per_block"] == 589_824
    assert t.loc["qk_norm", "per_block"] == 128
    assert t.loc["ffn", "per_block"] == 1_179_648
    assert t.loc["norms", "per_block"] == 768
    assert t.loc["final_norm", "count"] == 384
    assert round(t.loc["embedding", "share"], 2) == 0.18
    gpt1 = interp.param_table(SproutConfig.preset("gpt-1")).set_index("part")
    assert round(gpt1.loc["embedding", "share"], 1) == 0.8  # "80% of the parameters go on the vocabulary"


def test_doubling_d_model_about_quadruples_the_blocks():
    base = interp.param_table(SproutConfig.preset("sprout"))
    big = interp.param_table(SproutConfig.preset("sprout", d_model=768, d_ff=2048))
    blocks = lambda t: t[t.per_block.notna()]["count"].sum()
    assert 3.99 < blocks(big) / blocks(base) < 4.0  # the norm gains grow only twofold
    emb = lambda t: t.set_index("part").loc["embedding", "count"]
    assert emb(big) == 2 * emb(base)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 64), st.integers(1, 3), st.sampled_from([1, 2, 4]), st.sampled_from([8, 16]), st.integers(1, 40))
def test_any_config(vocab, n_layer, n_head, d_head, d_ff):
    cfg = SproutConfig(vocab_size=vocab, context=8, n_layer=n_layer, n_head=n_head, d_model=n_head * d_head, d_ff=d_ff)
    assert interp.param_table(cfg).set_index("part").loc["total", "count"] == Sprout(cfg).num_params()

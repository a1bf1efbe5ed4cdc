"""sprout.names.act_name against TransformerLens' own get_act_name, on every hook our models have."""
import pytest
from transformer_lens.utilities.components_utils import get_act_name

import sprout
from sprout.names import ATTN, BLOCK, MLP, NORM, act_name, block, layer_of


@pytest.mark.parametrize("name", BLOCK + tuple(n for n in ATTN if not n.endswith("_normed")) + MLP)
def test_block_hooks_match_transformer_lens(name):
    # TransformerLens has no QK-norm hooks; ours sit beside q and k: blocks.{l}.attn.hook_q_normed
    for layer in (0, 3, 11):
        assert act_name(name, layer) == get_act_name(name, layer)


@pytest.mark.parametrize("norm", ["ln1", "ln2"])
def test_norm_hooks_match_transformer_lens(norm):
    for name in NORM:
        assert act_name(name, 2, norm) == get_act_name(name, 2, norm)
    assert act_name("scale", layer_type="ln_final") == "ln_final.hook_scale"


def test_every_model_hook_is_named():
    assert act_name("q_normed", 1) == "blocks.1.attn.hook_q_normed"
    model = sprout.Sprout(sprout.SproutConfig(**sprout.PRESETS["gpt-1"]))
    named = {act_name(n, 0) for n in BLOCK + ATTN + MLP} | {act_name(n, 0, w) for n in NORM for w in ("ln1", "ln2")}
    named |= {act_name("embed")} | {act_name(n, layer_type="ln_final") for n in NORM} | {"unembed.hook_out"}
    assert set(model.hook_dict) <= named


def test_full_names_pass_through_and_layers_parse():
    assert act_name("blocks.1.hook_resid_pre") == "blocks.1.hook_resid_pre"
    assert block(4) + "hook_mlp_out" == act_name("mlp_out", 4)
    assert layer_of("blocks.12.attn.hook_z") == 12 and layer_of("hook_embed") is None


@pytest.mark.parametrize("bad", [("resid_psot", 1, None), ("resid_pre", None, None), ("resid_pre", -1, None),
                                 ("resid_pre", True, None), ("embed", 0, None), ("scale", 1, None),
                                 ("z", 1, "ln1")])
def test_bad_names_refused(bad):
    with pytest.raises(ValueError, match=repr(bad[0]) if bad[0] != "z" else "layer_type"):
        act_name(*bad)

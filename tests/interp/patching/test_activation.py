"""Activation patching sweeps equal TransformerLens' patching on the same model and inputs."""
import pytest
import torch
from transformer_lens import patching

import interp
from interp.patching.activation import patch_tensor

TL = {
    ("resid_pre", "position"): patching.get_act_patch_resid_pre,
    ("attn_out", "position"): patching.get_act_patch_attn_out,
    ("mlp_out", "position"): patching.get_act_patch_mlp_out,
    ("z", "head_position"): patching.get_act_patch_attn_head_out_by_pos,
    ("q", "head_position"): patching.get_act_patch_attn_head_q_by_pos,
    ("k", "head_position"): patching.get_act_patch_attn_head_k_by_pos,
    ("v", "head_position"): patching.get_act_patch_attn_head_v_by_pos,
    ("pattern", "head_position"): patching.get_act_patch_attn_head_pattern_by_pos,
    ("z", "head"): patching.get_act_patch_attn_head_out_all_pos,
    ("q", "head"): patching.get_act_patch_attn_head_q_all_pos,
    ("k", "head"): patching.get_act_patch_attn_head_k_all_pos,
    ("v", "head"): patching.get_act_patch_attn_head_v_all_pos,
    ("pattern", "head"): patching.get_act_patch_attn_head_pattern_all_pos,
}


def pair(seed=0, batch=2, pos=7, vocab=256):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, vocab, (batch, pos), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(1, vocab, (batch,), generator=g)
    corrupted[:, 4] = torch.randint(1, vocab, (batch,), generator=g)
    return clean, corrupted


def logit_diff(logits):
    return logits[:, -1, 5] - logits[:, -1, 9]  # one value per batch row


def scalar_metric(logits):
    return logit_diff(logits).mean()


@pytest.mark.parametrize("site,by", list(TL))
def test_patch_equals_transformer_lens(tiny_model, site, by):
    clean, corrupted = pair()
    _, cache = tiny_model.run_with_cache(clean)
    theirs = TL[site, by](tiny_model, corrupted, cache, scalar_metric)
    frame = interp.patch(tiny_model, clean, corrupted, scalar_metric, site=site, by=by, batch_size=5)
    torch.testing.assert_close(patch_tensor(frame), theirs.float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("site,by", [("z", "head_position"), ("resid_pre", "position"), ("pattern", "head"),
                                     ("mlp_out", "layer")])
def test_unembedding_only_the_metrics_positions_changes_nothing(tiny_model, site, by):
    clean, corrupted = pair(3)
    _, cache = tiny_model.run_with_cache(clean)
    frame = interp.patch(tiny_model, clean, corrupted, scalar_metric, site=site, by=by, logit_positions=-1,
                         batch_size=5)
    full = interp.patch(tiny_model, clean, corrupted, scalar_metric, site=site, by=by)
    assert frame["metric"].to_numpy() == pytest.approx(full["metric"].to_numpy(), abs=1e-5)
    if (site, by) in TL:
        theirs = TL[site, by](tiny_model, corrupted, cache, scalar_metric)
        torch.testing.assert_close(patch_tensor(frame), theirs.float(), atol=1e-5, rtol=0)


def test_logit_positions_are_checked(tiny_model):
    clean, corrupted = pair(4)
    seen = []

    def reads_two(logits):
        seen.append(torch.isnan(logits[:, :, 0]).any(0).tolist())
        return (logits[:, 2, 5] - logits[:, -1, 9]).mean()
    interp.patch(tiny_model, clean, corrupted, reads_two, site="z", by="head", logit_positions=[2, -1])
    # the metric sees [batch, pos, vocab] with real logits only at positions 2 and 6
    assert seen[0] == [True, True, False, True, True, True, False]
    with pytest.raises(ValueError, match="returned NaN with logit_positions=\\[6\\]"):
        interp.patch(tiny_model, clean, corrupted, reads_two, site="z", by="head", logit_positions=-1)
    for bad in (7, -8, [], [1.5], True):
        with pytest.raises(ValueError, match="logit_positions must be positions in -7..6"):
            interp.patch(tiny_model, clean, corrupted, scalar_metric, site="z", by="head", logit_positions=bad)


def test_layer_patch_of_the_residual_restores_the_clean_metric(tiny_model):
    clean, corrupted = pair(1)
    frame = interp.patch(tiny_model, clean, corrupted, logit_diff, site="resid_pre", by="layer")
    # the whole clean residual stream at any layer carries everything: the clean value comes back
    assert frame["metric"].to_numpy() == pytest.approx(frame["clean"].to_numpy(), abs=1e-5)
    assert frame["recovered"].to_numpy() == pytest.approx(1.0, abs=1e-4)


def test_one_forward_per_layer_when_the_chunk_allows(tiny_model):
    clean, corrupted = pair(2)
    calls = {0: [], 1: []}
    for layer in calls:
        tiny_model.blocks[layer].hook_resid_pre.add_hook(lambda x, hook, layer=layer: calls[layer].append(x.shape[0]),
                                                         is_permanent=True)
    try:
        interp.patch(tiny_model, clean, corrupted, scalar_metric, site="z", by="head_position")
    finally:
        tiny_model.reset_hooks(including_permanent=True)
    # block 0: the clean cache, the corrupted streams, layer 0's batched forward (its 7 * 4 patches of
    # batch 2 at once), two baselines; layer 1's batched forward starts at block 1, so block 0 runs once
    # for it (in the corrupted streams), not once per patch
    assert sorted(calls[0]) == [2, 2, 2, 2, 7 * 4 * 2]
    assert sorted(calls[1]) == [2, 2, 2, 2, 7 * 4 * 2, 7 * 4 * 2]


def test_bad_inputs_are_named(tiny_model):
    clean, corrupted = pair()
    with pytest.raises(ValueError, match="same \\[batch, pos\\] shape"):
        interp.patch(tiny_model, clean, corrupted[:, :-1], scalar_metric)
    with pytest.raises(ValueError, match="scalar or one value per batch row"):
        interp.patch(tiny_model, clean, corrupted, lambda logits: logits[:, -1, :3], site="resid_pre", by="layer")
    with pytest.raises(ValueError, match="unknown site"):
        interp.patch(tiny_model, clean, corrupted, scalar_metric, site="resid_post_typo")
    with pytest.raises(ValueError, match="has no heads"):
        interp.patch(tiny_model, clean, corrupted, scalar_metric, site="mlp_out", by="head")


def test_a_site_the_model_lacks_is_named():
    from sprout import build_step

    model = build_step("4.2").eval()  # a walkthrough step without residual connections
    ids = torch.randint(0, int(model.cfg.d_vocab), (1, 5))
    with pytest.raises(ValueError, match="has no hook point 'blocks.0.hook_resid_pre'"):
        interp.patch(model, ids, ids, scalar_metric, site="resid_pre")

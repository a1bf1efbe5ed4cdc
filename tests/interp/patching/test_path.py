"""Path patching against a hand-written direct-path patch (TransformerLens' convention) on Sprout's weights."""
import dataclasses

import pytest
import torch

import interp
from sprout import Sprout
from tests.conftest import TINY, needs_tl4, randomize_gains
from tests.interp.patching.test_activation import pair


@pytest.fixture(scope="module")
def three_layers():
    torch.manual_seed(1)
    return randomize_gains(Sprout(dataclasses.replace(TINY, n_layer=3)).eval())


def metric(logits):
    return logits[:, -1, 5] - logits[:, -1, 9]


def sender_write(model, cache, sender):
    """What the sender adds to the residual stream [batch, pos, d_model], from the cache and W_O."""
    if sender == "embed":
        return cache["hook_embed"]
    if sender.startswith("MLP"):
        return cache[f"blocks.{sender[3:]}.hook_mlp_out"]
    l, h = (int(x) for x in sender[1:].split("H"))
    return cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ model.blocks[l].attn.W_O[h]


@torch.no_grad()
def direct_path_by_hand(model, clean, corrupted, sender, receiver, via):
    """Corrupted run; the receiver's own `via` input is computed from resid_pre + (clean - corrupted) sender write."""
    _, cc = model.run_with_cache(clean)
    _, rc = model.run_with_cache(corrupted)
    delta = sender_write(model, cc, sender) - sender_write(model, rc, sender)
    rl, rh = (int(x) for x in receiver[1:].split("H"))
    block = model.blocks[rl]
    x = block.norm1(rc[f"blocks.{rl}.hook_resid_pre"] + delta)
    q, k, v = block.attn.qkv(x).split(model.cfg.d_model, dim=-1)
    new = {"q": q, "k": k, "v": v}[via].view(*x.shape[:2], model.cfg.n_heads, model.cfg.d_head)

    def hook(act, hook):
        act = act.clone()
        act[:, :, rh] = new[:, :, rh]
        return act
    return metric(model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{rl}.attn.hook_{via}", hook)])).mean().item()


@pytest.mark.parametrize("via", ["q", "k", "v"])
def test_denoising_equals_the_direct_path_by_hand(three_layers, via):
    clean, corrupted = pair(3, pos=8)
    senders = ["embed", "L0H1", "MLP0", "L1H3", "MLP1"]
    receivers = ["L1H0", "L2H2"]
    frame = interp.path_patch(three_layers, clean, corrupted, metric, senders, receivers, via=via,
                              direction="denoising", batch_size=3)
    assert len(frame) == 3 + 5  # L1H0 takes the three senders below layer 1, L2H2 all five
    for row in frame.itertuples():
        expected = direct_path_by_hand(three_layers, clean, corrupted, row.sender, row.receiver, via)
        assert row.metric == pytest.approx(expected, abs=1e-5), (row.sender, row.receiver)


def test_noising_is_denoising_with_the_roles_swapped(three_layers):
    clean, corrupted = pair(4, pos=8)
    kw = dict(senders=["L0H0", "L1H1"], receivers=["L2H0", "L2H3"], via="k")
    noising = interp.path_patch(three_layers, clean, corrupted, metric, **kw)
    swapped = interp.path_patch(three_layers, corrupted, clean, metric, direction="denoising", **kw)
    assert noising["metric"].tolist() == pytest.approx(swapped["metric"].tolist(), abs=1e-6)
    assert noising["base"].iloc[0] == pytest.approx(metric(three_layers.run_with_hooks(clean)).mean().item(), abs=1e-5)


def test_bad_senders_and_receivers_are_named(three_layers):
    clean, corrupted = pair(4, pos=8)
    with pytest.raises(ValueError, match="at or above every receiver"):
        interp.path_patch(three_layers, clean, corrupted, metric, ["L2H0"], ["L1H0"])
    with pytest.raises(ValueError, match="at or above every receiver"):
        interp.path_patch(three_layers, clean, corrupted, metric, ["L1H0"], ["L1H2"])
    with pytest.raises(ValueError, match="receivers must be attention heads"):
        interp.path_patch(three_layers, clean, corrupted, metric, ["L0H0"], ["MLP2"])
    with pytest.raises(ValueError, match="layer 7 is out of range"):
        interp.path_patch(three_layers, clean, corrupted, metric, ["L0H0"], ["L7H0"])
    with pytest.raises(ValueError, match="via must be"):
        interp.path_patch(three_layers, clean, corrupted, metric, ["L0H0"], ["L1H0"], via="z")
    with pytest.raises(ValueError, match="same \\[batch, pos\\] shape"):
        interp.path_patch(three_layers, clean[:1], corrupted, metric, ["L0H0"], ["L1H0"])


@pytest.mark.parametrize("via", ["q", "k", "v"])
@needs_tl4
def test_denoising_equals_transformer_lens_direct_path(three_layers, via):
    """TransformerLens' get_act_patch_direct_path runs on Sprout through its split q/k/v input hooks."""
    from transformer_lens import patching

    clean, corrupted = pair(6, pos=8)
    _, clean_cache = three_layers.run_with_cache(clean)
    _, corrupted_cache = three_layers.run_with_cache(corrupted)
    scalar = lambda logits: metric(logits).mean()  # noqa: E731
    theirs = patching.get_act_patch_direct_path(three_layers, corrupted, clean_cache, corrupted_cache, scalar, 0, 2,
                                               component=via, verbose=False)
    receivers = [f"L{l}H{h}" for l in (1, 2) for h in range(4)]
    frame = interp.path_patch(three_layers, clean, corrupted, scalar, ["L0H2"], receivers, via=via, direction="denoising")
    for row in frame.itertuples():
        assert row.metric == pytest.approx(float(theirs[row.receiver_layer, int(row.receiver.split("H")[1])]), abs=1e-5)


def test_a_model_without_residual_connections_is_refused():
    from sprout import build_step

    model = build_step("4.6").eval()  # a walkthrough step without residuals: no direct path to patch
    ids = torch.randint(0, int(model.cfg.d_vocab), (1, 6))
    with pytest.raises(ValueError, match="no hook point 'blocks.0.hook_resid_pre'"):
        interp.path_patch(model, ids, ids, lambda logits: logits[:, -1, 0].mean(), senders=["L0H0"],
                          receivers=["L1H0"], via="k")

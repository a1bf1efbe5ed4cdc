"""Direct logit attribution sums to the logits; attribution patching equals its first-order definition."""
import pytest
import torch

import interp
from sprout import build_step
from tests.interp.patching.test_activation import pair, scalar_metric


def test_dla_rows_sum_to_the_next_token_logit(tiny_model):
    ids = torch.randint(1, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    frame = interp.logit_attribution(tiny_model, ids)
    logits = tiny_model.run_with_hooks(ids)
    sums = frame.groupby(["seq", "pos"])["attribution"].sum()
    for (seq, pos), total in sums.items():
        assert total == pytest.approx(logits[seq, pos, ids[seq, pos + 1]].item(), abs=1e-4)
    assert len(sums) == 2 * 8  # the last position has no next token
    assert set(frame["component"]) == {"embed", "MLP0", "MLP1"} | {f"L{l}H{h}" for l in range(2) for h in range(4)}


def test_dla_of_a_logit_difference(tiny_model):
    ids = torch.randint(1, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    frame = interp.logit_attribution(tiny_model, ids, target=7, baseline=torch.arange(6) + 20)
    logits = tiny_model.run_with_hooks(ids)[0]
    sums = frame.groupby("pos")["attribution"].sum()
    expected = logits[:, 7] - logits[torch.arange(6), torch.arange(6) + 20]
    torch.testing.assert_close(torch.tensor(sums.to_numpy(), dtype=torch.float32), expected, atol=1e-4, rtol=0)


def test_dla_refuses_a_layernorm_model():
    model = build_step("4.10").eval()
    ids = torch.randint(0, int(model.cfg.d_vocab), (1, 5))
    with pytest.raises(ValueError, match="LayerNorm|RMS|W_U"):
        interp.logit_attribution(model, ids)


@pytest.mark.parametrize("site,by", [("resid_pre", "position"), ("z", "head_position"), ("pattern", "head"), ("v", "head")])
def test_attribution_is_the_derivative_along_the_patch(tiny_model, site, by):
    """(metric(corrupted + eps (clean - corrupted) on the patch) - metric(corrupted)) / eps -> attribution."""
    clean, corrupted = pair(5)
    frame = interp.attribution_patch(tiny_model, clean, corrupted, scalar_metric, site=site, by=by, exact=True)
    _, cc = tiny_model.run_with_cache(clean)
    _, rc = tiny_model.run_with_cache(corrupted)
    base = scalar_metric(tiny_model.run_with_hooks(corrupted)).item()
    eps = 1e-2
    for row in frame.sample(6, random_state=0).itertuples():
        name = interp._core.patch_engine.hook_name(site, row.layer)
        step = eps * (cc[name] - rc[name])
        mask = torch.zeros_like(step, dtype=torch.bool)
        p = interp._core.patch_engine.Patch(row.layer, None if row.head < 0 else row.head, None if row.pos < 0 else row.pos)
        interp._core.patch_engine._write(mask, torch.ones_like(mask), p, interp._core.patch_engine.SITES[site])

        def nudge(act, hook, step=step, mask=mask):
            return act + step * mask
        moved = scalar_metric(tiny_model.run_with_hooks(corrupted, fwd_hooks=[(name, nudge)])).item()
        assert row.attribution == pytest.approx((moved - base) / eps, rel=0.05, abs=2e-3)
    assert set(frame.columns) >= {"metric", "estimate", "attribution", "recovered"}


def test_attribution_patch_checks_its_metric(tiny_model):
    clean, corrupted = pair()
    with pytest.raises(ValueError, match="scalar or one value per batch row"):
        interp.attribution_patch(tiny_model, clean, corrupted, lambda logits: logits[:, :, 0])


def test_attribution_patch_leaves_no_gradient_on_the_model(tiny_model):
    clean, corrupted = pair(5)
    for p in tiny_model.parameters():
        p.grad = None
    interp.attribution_patch(tiny_model, clean, corrupted, scalar_metric, site="z", by="head")
    assert all(p.grad is None for p in tiny_model.parameters())


def test_dla_names_bad_targets(tiny_model):
    ids = torch.tensor([[3, 4, 5, 6]])
    vocab = int(tiny_model.cfg.d_vocab)
    for bad, match in ((vocab, "in 0.."), (-1, "in 0.."), (1.5, "integers")):
        with pytest.raises(ValueError, match=match):
            interp.logit_attribution(tiny_model, ids, target=bad)
        with pytest.raises(ValueError, match=match):
            interp.logit_attribution(tiny_model, ids, target=3, baseline=bad)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        interp.logit_attribution(tiny_model, ids[:, :1])
